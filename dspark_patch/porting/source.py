"""The target release's pristine files for a port: from a wheel, a local tree, or an image.

A wheel or a local tree is copied (its Python sources and dist-info only) into the work
folder's scratch tree, so the candidate is compiled and probed there and the user's own tree is
never written. An image is read through its container, which the candidate may be written into
and which is removed afterwards like every container of ours.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import zipfile
from pathlib import Path

from .. import ownfiles
from ..errors import BadInput, TargetNotFound

_STAMP = ".dspark-port-source"


def tree_from_wheel(wheel: Path, dest: Path) -> Path:
    """Unpack the wheel's .py files and dist-info into dest (once per wheel: its sha256 is stamped)."""
    if not wheel.is_file():
        raise TargetNotFound(f"--wheel {wheel}: no such file", hint="give the release's wheel file (pip download --no-deps)")
    digest = _sha256_file(wheel)
    if _stamp(dest) == digest:
        return dest
    _fresh(dest)
    try:
        with zipfile.ZipFile(wheel) as zf:
            for info in zf.infolist():
                name = info.filename
                if info.is_dir() or not _wanted(name):
                    continue
                target = (dest / name).resolve()
                if not target.is_relative_to(dest.resolve()):
                    raise BadInput(f"--wheel {wheel}: entry {name!r} points outside the folder it unpacks into",
                                   hint="this is not a well-formed wheel")
                target.parent.mkdir(parents=True, exist_ok=True)
                with zf.open(info) as src, open(target, "wb") as out:
                    shutil.copyfileobj(src, out)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BadInput(f"--wheel {wheel}: not a readable wheel ({exc})", hint="give a .whl file") from None
    ownfiles.write_file(dest / _STAMP, digest)
    return dest


def tree_from_root(root: Path, dest: Path, *, package: str) -> Path:
    """Copy the package's .py files and its dist-info from a site folder into dest (afresh)."""
    if not root.is_dir():
        raise TargetNotFound(f"--root {root}: no such directory", hint="give the site-packages folder that holds vllm")
    _fresh(dest)
    for top in sorted(root.iterdir()):
        if not (top.name == package or (top.name.startswith(f"{package}-") and top.name.endswith(".dist-info"))):
            continue
        for path in sorted(top.rglob("*")) if top.is_dir() else []:
            rel = path.relative_to(root).as_posix()
            if path.is_symlink() or not path.is_file() or not _wanted(rel) or "/__pycache__/" in rel:
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
    ownfiles.write_file(dest / _STAMP, f"root {root.resolve()}")
    return dest


def _fresh(dest: Path) -> None:
    """An empty scratch tree at `dest`, stamped as ours. Only a folder a port made (its stamp
    inside) is removed first, never through a link: the work folder may come from a checkout."""
    with ownfiles.open_folder(dest.parent) as parent:
        if os.path.lexists(dest):
            with parent.sub(dest.name, create=False) as old:
                if old.read(_STAMP, limit=4096) is None:
                    raise BadInput(f"{dest}: a folder port did not make is in the way of its scratch tree",
                                   hint="remove it, or give another --work folder")
            parent.remove_tree(dest.name)
        parent.sub(dest.name).close()
        with parent.sub(dest.name, create=False) as made:
            made.write(_STAMP, b"")


def _wanted(name: str) -> bool:
    top = name.split("/", 1)[0]
    return top.endswith(".dist-info") or name.endswith(".py")


def _stamp(dest: Path) -> str | None:
    try:
        with ownfiles.open_folder(dest, create=False) as folder:
            data = folder.read(_STAMP, limit=4096)
    except BadInput:  # missing, a link or not a folder: `_fresh` says which, or makes it
        return None
    return None if data is None else data.decode("utf-8", "replace")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
