"""A local site-packages folder as a read-only `SiteFiles` view (`dspark-patch status --root`).

Nothing is imported or run: METADATA and RECORD are read as files (importlib.metadata's
PathDistribution parses them), every file of the distribution's own folders is hashed
(targets/views/facts.py), every entry is looked at with lstat first, so a FIFO, socket or device is
listed as an entry that is not a regular file and never opened.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from importlib.metadata import PathDistribution
from pathlib import Path

from ...distname import canonical_name
from ...errors import AmbiguousDistribution, TargetNotFound
from ...inside.integrity import installer_files, own_folders
from ...inside.locate import BadRecord, read_record_rows
from ...references import DISTUTILS_HACK, PTH_CAP, all_scripts, script_rows
from .facts import file_chunks, read_facts
from .site_files import SiteFiles

_PY_DIR = re.compile(r"python(\d+\.\d+)")




def _retained(path: str, retain: frozenset[str]) -> bool:
    from ...references import bytecode_source

    return path in retain or bytecode_source(path) in retain


def read_site(root: Path, distribution: str, *, retain: Iterable[str] = ()) -> SiteFiles:
    """`retain`: paths (relative to root) whose bytes, and whose bytecode's, the view retains."""
    if not root.is_dir():
        raise TargetNotFound(f"--root {root}: no such directory", hint="give the site-packages folder that holds the package")
    root = root.resolve()
    retain = frozenset(retain)
    wanted = canonical_name(distribution)
    mine = []
    for info_dir in sorted(root.glob("*.dist-info")):
        dist = PathDistribution(info_dir)
        name = dist.metadata["Name"] if dist.metadata else None
        if name and canonical_name(name) == wanted:
            mine.append((info_dir, dist, name))
    if not mine:
        raise TargetNotFound(f"no {distribution} distribution (*.dist-info) in {root}",
                             hint="--root must be the site-packages folder that holds the package and its dist-info")
    if len(mine) > 1:
        raise AmbiguousDistribution(
            f"{root} holds {len(mine)} {distribution} distributions ({', '.join(i.name for i, _, _ in mine)})",
            hint="an installer leaves exactly one dist-info per distribution; which one the interpreter uses is not decidable")
    info_dir, dist, name = mine[0]
    try:
        rows = read_record_rows(info_dir / "RECORD")
    except BadRecord as exc:
        from ...errors import BadInput

        raise BadInput(f"{info_dir.name}/RECORD in {root}: {exc}", hint="the RECORD is malformed; reinstall the release") from None
    record = tuple((path, sha) for path, sha, _ in rows)
    hashes: dict[str, str] = {}
    others: list[str] = []
    pyc_headers: dict[str, bytes] = {}
    sources: dict[str, tuple[int, int, bytes | None]] = {}
    retained: dict[str, bytes] = {}
    top = wanted.replace("-", "_")
    folders = own_folders(p for p, _ in record) | {top} | {i.name for i in root.glob("*.dist-info")
                                                           if canonical_name(i.name.split("-")[0]) == wanted}
    # Plain strings below: os.walk's paths all start with the resolved root (pathlib's parsing
    # of 30,000 paths was a sixth of a status run on vLLM's tree).
    prefix = os.path.join(str(root), "")
    buf = bytearray(1 << 18)
    for folder in sorted(folders):
        base = root / folder
        if base.is_symlink() or not base.is_dir():
            if base.is_symlink() or base.exists():
                others.append(folder)
            continue
        for dirpath, dirnames, filenames in os.walk(base):
            rel_dir = dirpath[len(prefix):]
            for entry in [*dirnames, *filenames]:
                full = os.path.join(dirpath, entry)
                rel = f"{rel_dir}/{entry}"
                mode = os.lstat(full).st_mode
                if stat.S_ISDIR(mode):
                    continue
                if not stat.S_ISREG(mode):
                    others.append(rel)
                    continue
                with open(full, "rb", buffering=0) as fh:
                    facts = read_facts(rel, file_chunks(fh.fileno(), buf), retain=_retained(rel, retain))
                    mtime = int(os.fstat(fh.fileno()).st_mtime)
                hashes[rel] = facts.sha256
                if facts.header is not None:
                    pyc_headers[rel] = facts.header
                if rel.endswith(".py"):
                    sources[rel] = (mtime, facts.size, facts.source_hash)
                if facts.data is not None:
                    retained[rel] = facts.data
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    top_level: list[str] = []
    pth: dict[str, bytes | None] = {}
    for entry in os.scandir(root):
        if entry.is_dir(follow_symlinks=False):
            if entry.name.split(".", 1)[0] in ("sitecustomize", "usercustomize"):
                top_level.append(entry.name)  # a package of that name is imported too
            continue
        top_level.append(entry.name)
        if entry.name.endswith(".pth"):
            st = entry.stat(follow_symlinks=False)
            pth[entry.name] = (Path(entry.path).read_bytes() if stat.S_ISREG(st.st_mode) and st.st_size <= PTH_CAP
                               else None)
    hack = root / DISTUTILS_HACK   # what setuptools' distutils-precedence.pth imports at every start
    try:
        st = hack.lstat()
        pth[DISTUTILS_HACK] = hack.read_bytes() if stat.S_ISREG(st.st_mode) and st.st_size <= PTH_CAP else None
    except FileNotFoundError:
        pass
    listed: set[str] = set()
    for info in root.glob("*.dist-info"):
        try:
            listed.update(path for path, _, _ in read_record_rows(info / "RECORD", strict=False))
        except (OSError, BadRecord):
            continue
    found = _PY_DIR.search(str(root))
    metadata, scripts = installer_files(str(root), hashes, script_rows(record, all_scripts(name)))
    return SiteFiles(location=str(root), distribution=name, release=dist.version,
                     python=found.group(1) if found else None, record=record, hashes=hashes,
                     others=tuple(sorted(others)), top_level=tuple(sorted(top_level)), listed_anywhere=frozenset(listed),
                     pth=pth, dist_infos=(info_dir.name,), pyc_headers=pyc_headers, sources=sources, retained=retained,
                     metadata={k: None if v is None else v.encode("latin-1") for k, v in metadata.items()},
                     scripts={k: v["why"] if isinstance(v, dict) else None if v is None else v.encode("latin-1")
                              for k, v in scripts.items()})
