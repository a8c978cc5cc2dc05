"""Real vLLM releases for tests: wheels from the package index, cached, never committed.

The cache lives in $DSPARK_PATCH_CACHE (default ~/.cache/dspark-patch). A wheel is fetched once
with `pip download --no-deps`; an installed tree (a real `pip install --no-deps --target`, with
its RECORD and console-script entries) is made once per release and then hard-link copied for
each test. Because trees share inodes with the cache, tests change files only by replacing them
(`replace_file`), never by writing into them in place; the tool itself writes through
`os.replace`, so it never touches a shared inode.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import zipfile
from contextlib import contextmanager
from pathlib import Path

CACHE = Path(os.environ.get("DSPARK_PATCH_CACHE", Path.home() / ".cache" / "dspark-patch"))

# The releases the tests read: 0.33.0 (the shipped variant), 0.32.0 (a hand port develops the
# probe against it) and 0.31.0 (refused: no drafter helper). Any of them works with every
# function below; each wheel is downloaded once.
RELEASES = ("0.33.0", "0.32.0", "0.31.0")


@contextmanager
def _locked(name: str):
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        yield


def wheel(version: str) -> Path:
    """The real vllm==VERSION wheel from the package index (downloaded once)."""
    return _cached_wheel(version, CACHE / "wheels", f"wheel-{version}", [])


def _cached_wheel(version: str, wheels: Path, lock: str, pip_args: list[str]) -> Path:
    with _locked(lock):
        found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
        if not found:
            wheels.mkdir(parents=True, exist_ok=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
                 "--disable-pip-version-check", *pip_args, f"vllm=={version}", "-d", str(wheels)],
                check=True,
            )
            found = sorted(wheels.glob(f"vllm-{version}-*.whl"))
    return found[0]


def python_sources(version: str) -> Path:
    """Only the wheel's .py files, unpacked once (for diffing releases)."""
    dest = CACHE / "sources" / version
    with _locked(f"sources-{version}"):
        if not (dest / ".complete").exists():
            shutil.rmtree(dest, ignore_errors=True)
            with zipfile.ZipFile(wheel(version)) as zf:
                for info in zf.infolist():
                    if info.filename.endswith(".py"):
                        zf.extract(info, dest)
            (dest / ".complete").touch()
    return dest


def installed_tree(version: str) -> Path:
    """A real `pip install --no-deps --target` of the wheel, made once (read-only by convention)."""
    dest = CACHE / "trees" / f"vllm-{version}"
    with _locked(f"tree-{version}"):
        if not (dest / ".complete").exists():
            shutil.rmtree(dest, ignore_errors=True)
            subprocess.run(
                [sys.executable, "-m", "pip", "install", "--no-deps", "--quiet",
                 "--disable-pip-version-check", "--target", str(dest / "site-packages"),
                 str(wheel(version))],
                check=True,
            )
            (dest / ".complete").touch()
    return dest / "site-packages"


def tree_copy(version: str, where: Path) -> Path:
    """A fresh site-packages for one test: hard links into the cached install."""
    src = installed_tree(version)
    where.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-al", str(src), str(where)], check=True)
    return where


def replace_file(path: Path, data: bytes) -> None:
    """Change a file in a hard-linked test tree without touching the cache's inode."""
    tmp = path.with_name(path.name + ".tmp-test")
    tmp.write_bytes(data)
    shutil.copymode(path, tmp)
    os.replace(tmp, path)


def platform_wheel(version: str, platform: str) -> Path:
    """The real vllm==VERSION wheel for another platform (e.g. manylinux_2_28_aarch64), cached.

    Kept in a folder of its own: `wheel()` globs `wheels/vllm-VERSION-*.whl` for the host's.
    """
    return _cached_wheel(version, CACHE / "wheels" / platform, f"wheel-{version}-{platform}",
                         ["--platform", platform, "--only-binary=:all:"])
