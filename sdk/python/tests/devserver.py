"""Starts a real `asyncd dev` for the integration tests (binary from $ASYNCD_BIN)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Dict, Optional, Sequence


class DevServerError(RuntimeError):
    pass


def asyncd_bin() -> str:
    path = os.environ.get("ASYNCD_BIN")
    if not path:
        raise DevServerError(
            "ASYNCD_BIN is not set: the integration tests run a real `asyncd dev`; build it "
            "(cargo build, binary at /var/cache/asyncd/target/debug/asyncd) and export ASYNCD_BIN"
        )
    if not os.path.isfile(path) or not os.access(path, os.X_OK):
        raise DevServerError(f"ASYNCD_BIN={path} is not an executable asyncd binary: build it first")
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DevServer:
    def __init__(self, workdir: Path, env: Optional[Dict[str, str]] = None, args: Sequence[str] = (),
                 signing: Optional[Dict[str, Dict[str, str]]] = None) -> None:
        """``args`` are extra flags for ``asyncd dev``; ``signing`` maps a signing Secret's
        name to its keys, written where ``--signing-dir`` points as the operator mounts
        them: DIR/<name>/<key>."""
        self.bin = asyncd_bin()
        self.workdir = workdir
        self.config_dir = workdir / "config"
        self.config_dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.log_path = workdir / "asyncd.log"
        self.env = {**os.environ, **(env or {})}
        self.signing_dir = workdir / "signing"
        for name, keys in (signing or {}).items():
            (self.signing_dir / name).mkdir(parents=True, exist_ok=True)
            for key, value in keys.items():
                (self.signing_dir / name / key).write_text(value)
        self.proc: Optional[subprocess.Popen] = None
        self.args = list(args)

    def start(self, timeout: float = 60.0) -> None:
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [self.bin, "dev", "--config", str(self.config_dir), "--db", str(self.workdir / "asyncd.db"),
             "--listen", f"127.0.0.1:{self.port}", "--signing-dir", str(self.signing_dir), *self.args],
            stdout=log, stderr=subprocess.STDOUT, env=self.env,
        )
        log.close()
        try:
            for path in ("/healthz", "/readyz"):
                self._wait_200(path, timeout)
        except DevServerError:
            self.stop()
            raise

    def _wait_200(self, path: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise DevServerError(f"asyncd dev exited ({self.proc.returncode}) before {path} answered 200\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.endpoint + path, timeout=1) as resp:
                    if resp.status == 200:
                        return
                    last = str(resp.status)
            except urllib.error.HTTPError as e:
                last = str(e.code)
            except OSError as e:
                last = str(e)
            time.sleep(0.05)
        raise DevServerError(f"GET {path} did not answer 200 within {timeout}s (last: {last})\n{self.log_tail()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "asyncd log:\n" + "\n".join(text.splitlines()[-lines:])
