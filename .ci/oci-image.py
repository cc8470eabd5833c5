#!/usr/bin/env python3
"""Assembles haptic's container image as an OCI image layout, without Docker or a registry.

The image is what the Dockerfile builds: the static (musl) `haptic` binary at
/usr/local/bin/haptic, an /etc/passwd and /etc/group naming the user it runs as (65532, not
root), an empty /tmp and the journal directory /var/lib/haptic owned by that user; nothing else
(no shell, no libc). It is reproducible: entries sorted, owners and times fixed, gzip without a
timestamp, so the same binary gives the same digests.

Writes OUT/oci (an OCI image layout: oci-layout, index.json, blobs/sha256/...) and
OUT/haptic-VERSION.oci.tar (the same layout as one archive, for `skopeo copy oci-archive:...`
or `podman load`), and prints the manifest's digest.
"""

import argparse
import gzip
import hashlib
import io
import json
import shutil
import sys
import tarfile
import tomllib
from pathlib import Path

USER_ID = 65532
PASSWD = "root:x:0:0:root:/root:/sbin/nologin\nhaptic:x:65532:65532:haptic:/nonexistent:/sbin/nologin\n"
GROUP = "root:x:0:\nhaptic:x:65532:\n"
# Ports the controller listens on by default: the API and the health probes.
EXPOSED_PORTS = ["8080/tcp", "8081/tcp"]


def digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def layer(binary: bytes, mtime: int) -> bytes:
    """The one layer, as an uncompressed tar."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        def add(name: str, mode: int, data: bytes | None = None, owner: int = 0) -> None:
            info = tarfile.TarInfo(name)
            info.mode, info.uid, info.gid, info.mtime = mode, owner, owner, mtime
            info.uname = info.gname = "haptic" if owner else "root"
            if data is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))

        for name, mode, data, owner in sorted([
            ("etc", 0o755, None, 0),
            ("etc/group", 0o644, GROUP.encode(), 0),
            ("etc/passwd", 0o644, PASSWD.encode(), 0),
            ("tmp", 0o1777, None, 0),
            ("usr", 0o755, None, 0),
            ("usr/local", 0o755, None, 0),
            ("usr/local/bin", 0o755, None, 0),
            ("usr/local/bin/haptic", 0o755, binary, 0),
            ("var", 0o755, None, 0),
            ("var/lib", 0o755, None, 0),
            ("var/lib/haptic", 0o700, None, USER_ID),
        ]):
            add(name, mode, data, owner)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, type=Path, help="the static haptic binary")
    parser.add_argument("--out", required=True, type=Path, help="where the layout and archive go")
    parser.add_argument("--repository", default="ghcr.io/haptic-dev/haptic", help="the image's name")
    parser.add_argument("--cargo-toml", default=Path(__file__).resolve().parent.parent / "Cargo.toml", type=Path)
    parser.add_argument("--mtime", default=0, type=int, help="the files' time (SOURCE_DATE_EPOCH)")
    args = parser.parse_args()

    package = tomllib.loads(args.cargo_toml.read_text())["package"]
    version = package["version"]
    binary = args.binary.read_bytes()
    if binary[:4] != b"\x7fELF":
        print(f"oci-image: {args.binary} is not an ELF executable", file=sys.stderr)
        return 1

    tar = layer(binary, args.mtime)
    compressed = io.BytesIO()
    with gzip.GzipFile(fileobj=compressed, mode="wb", mtime=0, compresslevel=9) as gz:
        gz.write(tar)
    layer_blob = compressed.getvalue()
    labels = {
        "org.opencontainers.image.title": "haptic",
        "org.opencontainers.image.description": package["description"],
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.licenses": package["license"],
    }
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "User": f"{USER_ID}:{USER_ID}",
            "Entrypoint": ["/usr/local/bin/haptic"],
            "Cmd": ["run"],
            "WorkingDir": "/",
            "Env": ["PATH=/usr/local/bin"],
            "ExposedPorts": {port: {} for port in EXPOSED_PORTS},
            "Labels": labels,
        },
        "rootfs": {"type": "layers", "diff_ids": [digest(tar)]},
        "history": [{"created_by": ".ci/oci-image.py: the static haptic binary, its user, /tmp and /var/lib/haptic"}],
    }
    config_blob = json.dumps(config, sort_keys=True, separators=(",", ":")).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                   "digest": digest(config_blob), "size": len(config_blob)},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
                    "digest": digest(layer_blob), "size": len(layer_blob)}],
        "annotations": labels,
    }
    manifest_blob = json.dumps(manifest, sort_keys=True, separators=(",", ":")).encode()
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": [{
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "digest": digest(manifest_blob),
            "size": len(manifest_blob),
            "platform": {"architecture": "amd64", "os": "linux"},
            "annotations": {
                "org.opencontainers.image.ref.name": version,
                "io.containerd.image.name": f"{args.repository}:{version}",
            },
        }],
    }

    layout = args.out / "oci"
    if layout.exists():
        shutil.rmtree(layout)
    blobs = layout / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for blob in (layer_blob, config_blob, manifest_blob):
        (blobs / digest(blob).removeprefix("sha256:")).write_bytes(blob)
    (layout / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
    (layout / "index.json").write_text(json.dumps(index, sort_keys=True, indent=2) + "\n")

    archive = args.out / f"haptic-{version}.oci.tar"
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as out:
        for path in sorted(layout.rglob("*")):
            info = out.gettarinfo(str(path), arcname=str(path.relative_to(layout)))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = args.mtime
            if path.is_file():
                with path.open("rb") as data:
                    out.addfile(info, data)
            else:
                out.addfile(info)
    print(f"{args.repository}:{version} {digest(manifest_blob)} ({len(layer_blob)} bytes compressed) in {layout}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
