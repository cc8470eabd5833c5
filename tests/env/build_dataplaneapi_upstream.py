#!/usr/bin/env python3
"""Builds the HAProxy Dataplane API from upstream git, for machines without ../shared/third-party.

    build_dataplaneapi_upstream.py OUTPUT WORK_DIR DATAPLANEAPI_COMMIT CLIENT_NATIVE_COMMIT TAG

Clones github.com/haproxytech/dataplaneapi and client-native at the given commits, points the
Dataplane API at that client-native with a `replace` line, and runs upstream's own `go build`
(CGO off, -trimpath, version by ldflags), the same build ../shared/tools/build-dataplaneapi
runs from the source archives. Needs git, Go and internet access.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path


def run(*command: str, cwd: Path | None = None, env: dict | None = None) -> None:
    print("+", " ".join(command), flush=True)
    subprocess.run(command, cwd=cwd, env=env, check=True)


def checkout(url: str, commit: str, where: Path) -> None:
    shutil.rmtree(where, ignore_errors=True)
    where.mkdir(parents=True)
    run("git", "init", "--quiet", cwd=where)
    run("git", "fetch", "--quiet", "--depth", "1", url, commit, cwd=where)
    run("git", "checkout", "--quiet", "FETCH_HEAD", cwd=where)


def main() -> int:
    output, work, dataplane_commit, client_commit, tag = sys.argv[1:6]
    work_dir = Path(work).resolve()
    dataplane = work_dir / "dataplaneapi"
    client = work_dir / "client-native"
    checkout("https://github.com/haproxytech/dataplaneapi", dataplane_commit, dataplane)
    checkout("https://github.com/haproxytech/client-native", client_commit, client)
    run("go", "mod", "edit", "-replace", f"github.com/haproxytech/client-native/v6={client}", cwd=dataplane)
    ldflags = (f"-X main.GitRepo=github.com/haproxytech/dataplaneapi -X main.GitTag={tag} "
               f"-X main.GitCommit={dataplane_commit[:8]} -X main.GitDirty=")
    env = dict(os.environ, CGO_ENABLED="0")
    run("go", "build", "-buildvcs=false", "-trimpath", "-ldflags", ldflags, "-o", str(Path(output).resolve()),
        "./cmd/dataplaneapi", cwd=dataplane, env=env)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (subprocess.CalledProcessError, FileNotFoundError) as error:
        print(f"build_dataplaneapi_upstream: {error}", file=sys.stderr)
        sys.exit(3)
