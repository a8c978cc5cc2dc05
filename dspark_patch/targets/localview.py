"""A local site-packages folder as a read-only `SiteFiles` view (`dspark-patch status --root`).

Nothing is imported or run: METADATA and RECORD are read as files (importlib.metadata's
PathDistribution parses them), every file of the distribution's own folders is hashed.
"""

from __future__ import annotations

import csv
import hashlib
import os
import re
from importlib.metadata import PathDistribution
from pathlib import Path

from ..errors import TargetNotFound
from ..inside.integrity import own_folders
from ..inside.locate import record_of
from .sitefiles import SiteFiles

_PY_DIR = re.compile(r"python(\d+\.\d+)")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def read_site(root: Path, distribution: str) -> SiteFiles:
    if not root.is_dir():
        raise TargetNotFound(f"--root {root}: no such directory", hint="give the site-packages folder that holds the package")
    root = root.resolve()
    wanted = _normalize(distribution)
    for info_dir in sorted(root.glob("*.dist-info")):
        dist = PathDistribution(info_dir)
        name = dist.metadata["Name"] if dist.metadata else None
        if name and _normalize(name) == wanted:
            break
    else:
        raise TargetNotFound(f"no {distribution} distribution (*.dist-info) in {root}",
                             hint="--root must be the site-packages folder that holds the package and its dist-info")
    _, rows = record_of(dist)
    record = tuple((path, sha) for path, sha, _ in rows)
    hashes: dict[str, str] = {}
    others: list[str] = []
    for folder in sorted(own_folders(p for p, _ in record)):
        top = root / folder
        if top.is_symlink() or not top.is_dir():
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            for entry in [*dirnames, *filenames]:
                full = Path(dirpath) / entry
                rel = full.relative_to(root).as_posix()
                if full.is_symlink() or not (full.is_dir() or full.is_file()):
                    others.append(rel)
                elif full.is_file():
                    hashes[rel] = _sha256(full)
            dirnames[:] = [d for d in dirnames if not (Path(dirpath) / d).is_symlink()]
    top_level = tuple(sorted(e.name for e in os.scandir(root) if not e.is_dir()))
    listed: set[str] = set()
    for info in root.glob("*.dist-info"):
        try:
            with open(info / "RECORD", newline="", encoding="utf-8") as fh:
                listed.update(row[0] for row in csv.reader(fh) if row)
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
    found = _PY_DIR.search(str(root))
    return SiteFiles(location=str(root), distribution=name, release=dist.version,
                     python=found.group(1) if found else None, record=record, hashes=hashes,
                     others=tuple(sorted(others)), top_level=top_level, listed_anywhere=frozenset(listed))
