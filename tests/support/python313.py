"""An x86_64 CPython 3.13 on this (3.11) host: trixie's own python3.13, run in a chroot of the
trixie base image's files (exported once, kept in the cache by the image's id). `publish --python`
takes it to recompile a 3.13 image's bytecode; nothing of the host's PATH is relied on."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from tests.support.images import built_images
from tests.support.tool_folder import CACHE


def python313() -> Path:
    """An executable that runs trixie's python3.13 with the arguments and standard input given."""
    image = built_images()["trixie-base"]
    image_id = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True,
                              text=True, check=True).stdout.strip().removeprefix("sha256:")[:12]
    folder = CACHE / f"python3.13-{image_id}"
    wrapper = folder / "python3.13"
    if wrapper.exists():
        return wrapper
    folder.parent.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix=".python3.13-", dir=folder.parent))
    name = f"dspark-test-python313-{os.getpid()}"
    subprocess.run(["docker", "create", "--name", name, image, "true"], capture_output=True, check=True)
    try:
        with subprocess.Popen(["docker", "export", name], stdout=subprocess.PIPE) as export:
            with tarfile.open(fileobj=export.stdout, mode="r|") as tar:
                tar.extractall(made / "root", filter="fully_trusted")   # our own image, root's files kept
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True, check=False)
    (made / "python3.13").write_text(f'#!/bin/sh\nexec chroot {folder / "root"} /usr/bin/python3.13 "$@"\n')
    (made / "python3.13").chmod(0o755)
    try:
        made.rename(folder)
    except OSError:   # another worker made it meanwhile
        shutil.rmtree(made, ignore_errors=True)
    return wrapper
