#!/usr/bin/env python3
"""Writes a one-layer OCI image (an OCI image layout, as a tar archive) without a Docker
engine or a registry: the files named on the command line, the shared libraries every ELF
file among them needs (found with ldd, so the image runs what the host built), and a
minimal /etc. `ctr -n k8s.io images import` loads the archive into containerd.

The archive is reproducible (sorted entries, mtime 0, no compression timestamps): the
same inputs give the same digest, so a warm run can skip an import that changed nothing.

  oci-image.py --name docker.io/library/asyncd:dev --out asyncd.tar \
      --entrypoint /usr/local/bin/asyncd --user 65532:65532 --port 7700 \
      --file target/release/asyncd:/usr/local/bin/asyncd --ca-certs --zoneinfo

Flags:
  --file SRC:DST      a file (mode kept); ELF files pull in their libraries
  --tree SRC:DST      a directory tree (symlinks kept; ELF files pull in their libraries)
  --exclude GLOB      leave out paths of --tree that match (fnmatch on the source path)
  --link DST:TARGET   a symbolic link
  --ca-certs          /etc/ssl/certs/ca-certificates.crt of the host (Debian's ca-certificates)
  --zoneinfo          /usr/share/zoneinfo of the host (Debian's tzdata)
  --entrypoint ...    the entrypoint (repeat for more words); --cmd likewise
  --env K=V           environment (PATH is always set)
  --user UID:GID      the user; --port N an exposed TCP port; --workdir DIR
"""
import argparse
import fnmatch
import gzip
import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile

PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def needed_libs(path):
    """Absolute paths of the shared libraries (and the loader) an ELF file needs."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True)
    if out.returncode != 0:  # "not a dynamic executable": static
        return []
    libs = []
    for line in out.stdout.splitlines():
        line = line.strip()
        if "=>" in line:
            target = line.split("=>", 1)[1].strip().split(" (")[0].strip()
            if target == "not found":
                sys.exit(f"oci-image: {path} needs a library ldd cannot find: {line}")
            if target.startswith("/"):
                libs.append(target)
        elif line.startswith("/"):
            libs.append(line.split(" (")[0].strip())
    return libs


class Layer:
    def __init__(self):
        self.entries = {}  # dst -> (kind, source or target, mode)

    def add_dir(self, dst, mode=0o755):
        dst = "/" + dst.strip("/")
        parts = dst.strip("/").split("/")
        for i in range(1, len(parts) + 1):
            d = "/" + "/".join(parts[:i])
            if d not in self.entries:
                self.entries[d] = ("dir", None, mode if i == len(parts) else 0o755)

    def add_file(self, src, dst, mode=None):
        dst = "/" + dst.lstrip("/")
        self.add_dir(os.path.dirname(dst))
        self.entries[dst] = ("file", src, mode if mode is not None else os.stat(src).st_mode & 0o7777)
        if is_elf(src):
            for lib in needed_libs(src):
                self.add_host_path(lib)

    def add_bytes(self, dst, data, mode=0o644):
        dst = "/" + dst.lstrip("/")
        self.add_dir(os.path.dirname(dst))
        self.entries[dst] = ("bytes", data, mode)

    def add_link(self, dst, target):
        dst = "/" + dst.lstrip("/")
        self.add_dir(os.path.dirname(dst))
        self.entries[dst] = ("link", target, 0o777)

    def add_host_path(self, path):
        """A host file at the same path, following symlinks as links (libraries are
        usually reached through one, e.g. libssl.so.3 -> libssl.so.3.0.x)."""
        seen = set()
        while path not in seen:
            seen.add(path)
            if path in self.entries:
                return
            if os.path.islink(path):
                target = os.readlink(path)
                self.add_link(path, target)
                path = os.path.normpath(os.path.join(os.path.dirname(path), target))
                continue
            self.add_file(path, path)
            return

    def add_tree(self, src, dst, excludes):
        src = src.rstrip("/")
        for root, dirs, files in os.walk(src):
            dirs.sort()
            rel = os.path.relpath(root, src)
            if any(fnmatch.fnmatch(root, g) for g in excludes):
                dirs[:] = []
                continue
            self.add_dir(os.path.normpath(os.path.join(dst, rel)))
            for name in sorted(files) + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
                path = os.path.join(root, name)
                if any(fnmatch.fnmatch(path, g) for g in excludes):
                    continue
                target = os.path.normpath(os.path.join(dst, rel, name))
                if os.path.islink(path):
                    self.add_link(target, os.readlink(path))
                else:
                    self.add_file(path, target)

    def tar(self):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
            for dst in sorted(self.entries):
                kind, what, mode = self.entries[dst]
                info = tarfile.TarInfo(dst.lstrip("/"))
                info.mtime = 0
                info.mode = mode
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                if kind == "dir":
                    info.type = tarfile.DIRTYPE
                    t.addfile(info)
                elif kind == "link":
                    info.type = tarfile.SYMTYPE
                    info.linkname = what
                    t.addfile(info)
                else:
                    data = what if kind == "bytes" else open(what, "rb").read()
                    info.size = len(data)
                    t.addfile(info, io.BytesIO(data))
        return buf.getvalue()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--file", action="append", default=[])
    ap.add_argument("--tree", action="append", default=[])
    ap.add_argument("--exclude", action="append", default=[])
    ap.add_argument("--link", action="append", default=[])
    ap.add_argument("--ca-certs", action="store_true")
    ap.add_argument("--zoneinfo", action="store_true")
    ap.add_argument("--entrypoint", action="append", default=[])
    ap.add_argument("--cmd", action="append", default=[])
    ap.add_argument("--env", action="append", default=[])
    ap.add_argument("--user", default="")
    ap.add_argument("--port", action="append", default=[])
    ap.add_argument("--workdir", default="/")
    a = ap.parse_args()

    layer = Layer()
    layer.add_dir("/tmp", 0o1777)
    layer.add_bytes("/etc/passwd", b"root:x:0:0:root:/root:/sbin/nologin\n"
                    b"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")
    layer.add_bytes("/etc/group", b"root:x:0:\nnonroot:x:65532:\n")
    layer.add_bytes("/etc/nsswitch.conf", b"hosts: files dns\n")
    layer.add_dir("/home/nonroot")
    for spec in a.file:
        src, dst = spec.split(":", 1)
        layer.add_file(src, dst)
    for spec in a.tree:
        src, dst = spec.split(":", 1)
        layer.add_tree(src, dst, a.exclude)
    for spec in a.link:
        dst, target = spec.split(":", 1)
        layer.add_link(dst, target)
    if a.ca_certs:
        layer.add_file("/etc/ssl/certs/ca-certificates.crt", "/etc/ssl/certs/ca-certificates.crt", 0o644)
    if a.zoneinfo:
        layer.add_tree("/usr/share/zoneinfo", "/usr/share/zoneinfo", [])

    raw = layer.tar()
    diff_id = "sha256:" + hashlib.sha256(raw).hexdigest()
    gz = io.BytesIO()
    with gzip.GzipFile(fileobj=gz, mode="wb", mtime=0, compresslevel=1) as g:
        g.write(raw)
    layer_blob = gz.getvalue()

    env = [f"PATH={PATH}"] + a.env
    config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {"Env": env, "WorkingDir": a.workdir},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "e2e/cluster/oci-image.py"}],
    }
    if a.entrypoint:
        config["config"]["Entrypoint"] = a.entrypoint
    if a.cmd:
        config["config"]["Cmd"] = a.cmd
    if a.user:
        config["config"]["User"] = a.user
    if a.port:
        config["config"]["ExposedPorts"] = {f"{p}/tcp": {} for p in a.port}
    config_blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()

    def desc(media, blob):
        return {"mediaType": media, "digest": "sha256:" + hashlib.sha256(blob).hexdigest(), "size": len(blob)}

    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": desc("application/vnd.oci.image.config.v1+json", config_blob),
        "layers": [desc("application/vnd.oci.image.layer.v1.tar+gzip", layer_blob)],
    }
    manifest_blob = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    mdesc = desc("application/vnd.oci.image.manifest.v1+json", manifest_blob)
    mdesc["platform"] = {"architecture": "amd64", "os": "linux"}
    mdesc["annotations"] = {
        "io.containerd.image.name": a.name,
        "org.opencontainers.image.ref.name": a.name.rsplit(":", 1)[-1],
    }
    index = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": [mdesc]}

    tmp = a.out + ".tmp"
    with tarfile.open(tmp, mode="w") as t:
        def put(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = 0
            info.mode = 0o644
            t.addfile(info, io.BytesIO(data))
        put("oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        put("index.json", json.dumps(index, sort_keys=True).encode())
        for blob in (config_blob, layer_blob, manifest_blob):
            put("blobs/sha256/" + hashlib.sha256(blob).hexdigest(), blob)
    os.replace(tmp, a.out)
    print(f"{a.name} {mdesc['digest']} {len(layer_blob) // 1024} KiB -> {a.out}")


if __name__ == "__main__":
    main()
