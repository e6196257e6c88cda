#!/usr/bin/env python3
"""Runs every code block of the SDK READMEs, in order, as a reader following them would.

    readme_test.py README.md [README.md ...]

Each README is one session in a fresh directory, inside its own network namespace
(`unshare --net`, loopback only), so the fixed ports the READMEs use (asyncd on
127.0.0.1:7700, executors on 127.0.0.1:8080) never clash with anything else on the
machine. What a block is decides how it runs; the info string after the language says
more:

- ```sh install — run first, outside the namespace (it may need the network), in the
  repository root (the READMEs install from a checkout). `pip` is the test venv's.
- ```yaml file=PATH — written to PATH in the session directory.
- ```sh — run with bash -euo pipefail in the session directory. A line starting with
  `asyncd dev` starts asyncd in the background (its log is shown on failure); the next
  line runs once its --listen address answers /readyz.
- ```python — run as a script with the test venv's python; it must exit 0.
- ```go — a `package main` program, run with `go run` in the session's module (which
  the README's own sh blocks create); it must exit 0.
- ```rust example=NAME — must appear verbatim in sdk/rust/examples/NAME.rs (a test
  that compiles and runs that example is a test of the README block); the example binary
  is run and must exit 0.
- ```toml, ```text — a manifest excerpt or sample output: nothing to run.

Environment: ASYNCD_BIN (the asyncd binary, put on PATH as `asyncd`), ASYNCD_VENV (the
venv with the Python SDK), ASYNCD_RUST_EXAMPLES (a directory holding the built Rust
example binaries), ASYNCD_REPO (the repository root; the READMEs' Go install points its
replace directive there).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List

FENCE = re.compile(r"^```(\S*)[ \t]*(.*)$")
BLOCK_TIMEOUT = 120
# An install block may build asyncd (a no-op when ASYNCD_BIN is up to date, minutes when not).
INSTALL_TIMEOUT = 1800


@dataclass
class Block:
    lang: str
    attrs: Dict[str, str]
    flags: List[str]
    code: str
    line: int

    def where(self, readme: Path) -> str:
        return f"{readme}:{self.line} (```{self.lang})"


def blocks(readme: Path) -> List[Block]:
    out: List[Block] = []
    lines = readme.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m or not m.group(1):
            i += 1
            continue
        start = i + 1
        j = start
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        attrs: Dict[str, str] = {}
        flags: List[str] = []
        for word in m.group(2).split():
            if "=" in word:
                k, v = word.split("=", 1)
                attrs[k] = v
            else:
                flags.append(word)
        out.append(Block(m.group(1), attrs, flags, "\n".join(lines[start:j]) + "\n", start))
        i = j + 1
    return out


class Failure(Exception):
    pass


def run(cmd: List[str], cwd: Path, env: Dict[str, str], what: str, timeout: int = BLOCK_TIMEOUT) -> str:
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise Failure(f"{what}: timed out after {timeout}s; output:\n{e.stdout or ''}") from None
    if p.returncode != 0:
        raise Failure(f"{what}: exit {p.returncode}; output:\n{p.stdout}")
    return p.stdout


def wait_ready(listen: str, server: subprocess.Popen, log: Path, what: str) -> None:
    deadline = time.monotonic() + 60
    url = f"http://{listen}/readyz"
    while True:
        if server.poll() is not None:
            raise Failure(f"{what}: asyncd dev exited {server.returncode}:\n{log.read_text()}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise Failure(f"{what}: asyncd dev not ready at {url} within 60s:\n{log.read_text()}")
        time.sleep(0.1)


class Session:
    def __init__(self, readme: Path, root: Path, env: Dict[str, str]) -> None:
        self.readme, self.root, self.env = readme, root, env
        self.servers: List[subprocess.Popen] = []

    def close(self) -> None:
        for s in self.servers:
            s.terminate()
        for s in self.servers:
            try:
                s.wait(10)
            except subprocess.TimeoutExpired:
                s.kill()

    def sh(self, block: Block) -> None:
        pending: List[str] = []

        def flush() -> None:
            if pending:
                script = "set -euo pipefail\n" + "\n".join(pending) + "\n"
                out = run(["bash", "-c", script], self.root, self.env, block.where(self.readme))
                sys.stdout.write(out)
                pending.clear()

        for line in block.code.splitlines():
            if line.startswith("asyncd dev"):
                flush()
                args = shlex.split(line.split(" #", 1)[0])
                listen = args[args.index("--listen") + 1] if "--listen" in args else "127.0.0.1:7700"
                log = self.root / f"asyncd-{len(self.servers)}.log"
                server = subprocess.Popen(["bash", "-c", "exec " + line], cwd=self.root, env=self.env,
                                          stdout=log.open("w"), stderr=subprocess.STDOUT)
                self.servers.append(server)
                wait_ready(listen, server, log, block.where(self.readme))
            else:
                pending.append(line)
        flush()

    def program(self, block: Block) -> None:
        what = block.where(self.readme)
        if block.lang == "python":
            path = self.root / f"block{block.line}.py"
            path.write_text(block.code)
            cmd = [str(Path(self.env["ASYNCD_VENV"]) / "bin" / "python"), path.name]
        elif block.lang == "go":
            if not block.code.lstrip().startswith("package main"):
                raise Failure(f"{what}: a Go block must be a whole program (package main)")
            pkg = self.root / f"block{block.line}"
            pkg.mkdir()
            (pkg / "main.go").write_text(block.code)
            cmd = ["go", "run", f"./{pkg.name}"]
        else:
            name = block.attrs.get("example")
            if not name:
                raise Failure(f"{what}: a Rust block names the example it is part of (```rust example=NAME)")
            source = Path(self.env["ASYNCD_REPO"]) / "sdk" / "rust" / "examples" / f"{name}.rs"
            if block.code not in source.read_text():
                raise Failure(f"{what}: the block is not verbatim in {source}: update the example with the README")
            cmd = [str(Path(self.env["ASYNCD_RUST_EXAMPLES"]) / name)]
        out = run(cmd, self.root, self.env, what)
        sys.stdout.write(out)


def session(readme: Path) -> None:
    """Runs the README's blocks that need no network, in this (fresh) namespace."""
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    root = Path(tempfile.mkdtemp(prefix="asyncd-readme-"))
    env = dict(os.environ)
    bindir = root / ".bin"
    bindir.mkdir()
    (bindir / "asyncd").symlink_to(env["ASYNCD_BIN"])
    env["PATH"] = f"{bindir}:{Path(env['ASYNCD_VENV']) / 'bin'}:{env['PATH']}"
    env["GOFLAGS"] = "-mod=mod"
    env["GOPROXY"] = "off"
    s = Session(readme, root, env)
    try:
        for block in blocks(readme):
            if "install" in block.flags or block.lang in ("text", "toml"):
                continue
            print(f"--- {block.where(readme)}", flush=True)
            if block.lang == "yaml":
                if "file" not in block.attrs:
                    raise Failure(f"{block.where(readme)}: a yaml block says where it goes (```yaml file=PATH)")
                path = root / block.attrs["file"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(block.code)
            elif block.lang == "sh":
                s.sh(block)
            elif block.lang in ("python", "go", "rust"):
                s.program(block)
            else:
                raise Failure(f"{block.where(readme)}: no way to run a ```{block.lang} block")
    except Failure:
        for log in sorted(root.glob("asyncd-*.log")):
            print(f"--- tail of {log.name}", file=sys.stderr)
            print("\n".join(log.read_text().splitlines()[-30:]), file=sys.stderr)
        raise
    finally:
        s.close()
        shutil.rmtree(root, ignore_errors=True)


def main(argv: List[str]) -> int:
    if len(argv) >= 2 and argv[0] == "--session":
        try:
            session(Path(argv[1]))
        except Failure as e:
            print(f"readme_test: {e}", file=sys.stderr)
            return 1
        return 0
    repo = Path(os.environ["ASYNCD_REPO"])
    env = dict(os.environ)
    env["PATH"] = f"{Path(env['ASYNCD_VENV']) / 'bin'}:{env['PATH']}"
    # The READMEs build asyncd with cargo: into the target directory ASYNCD_BIN was
    # built in, where it is up to date, so that the block costs a check, not a build.
    bin_path = Path(env["ASYNCD_BIN"]).resolve()
    if bin_path.parent.name in ("debug", "release"):
        env["CARGO_TARGET_DIR"] = str(bin_path.parent.parent)
    failed = 0
    for arg in argv:
        readme = Path(arg).resolve()
        counted = blocks(readme)
        try:
            for block in counted:
                if "install" in block.flags:
                    print(f"--- {block.where(readme)} (install, in {repo})", flush=True)
                    sys.stdout.write(run(["bash", "-c", "set -euo pipefail\n" + block.code], repo, env,
                                         block.where(readme), INSTALL_TIMEOUT))
        except Failure as e:
            print(f"readme_test: {e}", file=sys.stderr)
            failed += 1
            continue
        p = subprocess.run(["unshare", "--net", sys.executable, __file__, "--session", str(readme)], env=env)
        if p.returncode != 0:
            failed += 1
        else:
            print(f"readme_test: {readme}: all {len(counted)} blocks ran", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
