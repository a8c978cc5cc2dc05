"""dspark-patch as a CI job inside the serving image installs it: a `pip install --target` folder
beside the image's own packages, run with the image's python (`PYTHONPATH=DIR python3 -m
dspark_patch`), never touching the image's packages.

Made offline for the fixture images' python (CPython 3.11, x86_64, glibc): the tool's own wheel is
built from this checkout and installed with `pip install --no-deps --target`; its dependencies are
the very files this checkout's virtualenv installed for them (each distribution's RECORD: the
wheels pip installed here, the same CPython ABI), kept once in the cache by their names and versions.
"""

from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("DSPARK_PATCH_CACHE", Path.home() / ".cache" / "dspark-patch"))


def _closure(name: str) -> list[md.Distribution]:
    """The distributions `name` needs to run (no extras), itself excluded."""
    seen: dict[str, md.Distribution] = {}
    todo = [name]
    while todo:
        wanted = todo.pop()
        key = re.sub(r"[-_.]+", "-", wanted).lower()
        if key in seen:
            continue
        dist = seen[key] = md.distribution(wanted)
        for line in dist.requires or ():
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return [d for k, d in sorted(seen.items()) if k != re.sub(r"[-_.]+", "-", name).lower()]


def _dependencies() -> Path:
    deps = _closure("dspark-patch")
    key = hashlib.sha256("\n".join(f"{d.metadata['Name']}=={d.version}" for d in deps).encode()
                         + sys.implementation.cache_tag.encode()).hexdigest()[:12]
    folder = CACHE / "tool-deps" / key
    if (folder / ".complete").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix=".tool-deps-", dir=folder.parent))
    made.chmod(0o755)   # as pip makes a --target folder: any user of the image reads it
    for dist in deps:
        _copy_distribution(dist, made)
    (made / ".complete").touch()
    try:
        made.rename(folder)
    except OSError:   # another worker made it meanwhile: theirs is as good
        shutil.rmtree(made, ignore_errors=True)
    return folder


def tool_folder(where: Path, *, arm64: bool = False) -> Path:
    """A fresh folder at `where`: the dependencies (hard links into the cached copy) and the tool's
    wheel built from this checkout, installed with `pip install --no-deps --target`. `arm64`: for
    the arm64 official-shape fixture's python (CPython 3.13, aarch64; `_arm64_dependencies`)."""
    shutil.copytree(_arm64_dependencies() if arm64 else _dependencies(), where, copy_function=os.link,
                    ignore=shutil.ignore_patterns(".complete"))
    where.chmod(0o755)
    with tempfile.TemporaryDirectory() as tmp:
        # Built from a copy: a build in the checkout would leave build/ and *.egg-info there.
        source, wheels = Path(tmp) / "source", Path(tmp) / "wheels"
        for name in ("pyproject.toml", "setup.py", "README.md"):
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, source / name)
        for name in ("dspark_patch", "patches"):
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                        "--wheel-dir", str(wheels), str(source)], check=True, capture_output=True)
        wheel = next(wheels.glob("dspark_patch-*.whl"))
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(where),
                        str(wheel)], check=True, capture_output=True)
    return where


# Debian trixie's packages of the tool's dependencies, as a team whose arm64 runner has no
# wheels of them would install them; the package index this machine reaches has no aarch64
# wheels of pydantic-core, which the index's typer needs.
ARM64_PACKAGES = ("python3-typer", "python3-rich", "python3-jsonschema", "python3-docker", "python3-requests",
                  "python3-cryptography")
# Pure-Python dependencies taken from this virtualenv: Debian has no oras, and trixie's unidiff
# (0.7.5) reads no file modes.
PURE_FROM_HERE = ("oras", "unidiff")


def _copy_distribution(dist: md.Distribution, into: Path) -> None:
    """The files `dist` installed in its site folder, copied into `into` as they lie there."""
    for entry in dist.files or ():
        rel = Path(str(entry))
        if rel.is_absolute() or ".." in rel.parts or "__pycache__" in rel.parts:
            continue   # console scripts outside the site folder, bytecode the image's python makes itself
        source = Path(str(dist.locate_file(entry)))
        if source.is_file():
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / rel)


def _arm64_dependencies() -> Path:
    """The tool's dependencies for CPython 3.13 on aarch64: Debian trixie's arm64 packages
    (`mmdebstrap --variant=extract`, the way scripts/build-arm64-fixture gets the fixture's
    torch; unpacked, nothing run), their dist-packages folder, plus PURE_FROM_HERE. Cached."""
    pure = [f"{name}=={md.version(name)}" for name in PURE_FROM_HERE]
    key = hashlib.sha256("\n".join([*ARM64_PACKAGES, *pure]).encode()).hexdigest()[:12]
    folder = CACHE / "tool-deps" / f"trixie-arm64-{key}"
    if (folder / ".complete").exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder.parent) as tmp:
        rootfs = Path(tmp) / "rootfs"
        mirror = subprocess.run(["bash", "-c", f"source {ROOT}/scripts/lib.sh && debian_mirror"], capture_output=True,
                                text=True, check=True).stdout.strip()
        subprocess.run(["mmdebstrap", "--quiet", "--variant=extract", "--architectures=arm64",
                        f"--include={','.join(ARM64_PACKAGES)}", "--hook-dir=/usr/share/mmdebstrap/hooks/merged-usr",
                        "trixie", str(rootfs), mirror], check=True, capture_output=True, stdin=subprocess.DEVNULL)
        made = Path(tmp) / "deps"
        shutil.copytree(rootfs / "usr/lib/python3/dist-packages", made, symlinks=True)
        for name in PURE_FROM_HERE:
            for old in [*made.glob(f"{name}"), *made.glob(f"{name}-*")]:
                shutil.rmtree(old) if old.is_dir() else old.unlink()
            _copy_distribution(md.distribution(name), made)
        subprocess.run(["chmod", "-R", "a+rX", str(made)], check=True)
        (made / ".complete").touch()
        try:
            made.rename(folder)
        except OSError:   # another worker made it meanwhile
            pass
    return folder
