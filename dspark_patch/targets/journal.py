"""The journal of an `apply --root`: what a later run needs when this one is killed half-way.

While the process lives, a failed write or probe puts every file back (targets/fs.py, the
pipeline's restore). A SIGKILL, an OOM kill or a power cut between two renames ends the process
before it can: the tree is half-patched, or fully patched but never probed. So before the first
rename, `apply --root` writes `.dspark-patch-journal.json` into the site folder it patches:

- for every file of the plan: its path, its pre-image (bytes, sha256, mode; null where the plan
  adds the file) and the sha256 of its post-image (null where the plan deletes it);
- for the bytecode of each patched module that the compile step will replace: the same, its
  post-image unknown until the compile has run;
- the folders the write makes (for an added file), and the processes whose temporary files may
  stand beside the files (`.NAME.PID.N.dspark-tmp`, targets/fs.py).

It is written through a temporary file and renamed into place, never through a link
(ownfiles.py), and removed only when the run is whole (written, compiled, probed, its report
written) or rolled back; targets/recovery.py says what a run that finds one does. Its bytes are
read as hostile: a journal that is not a regular file, is larger than `LIMIT`, is not this
schema, names a path that leaves the tree, or carries a pre-image that does not hash to its own
sha256 is refused (`BadJournal`, exit 2) and nothing is touched.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import ownfiles
from ..errors import BadInput, BadJournal, DsparkPatchError, EnvironmentProblem
from . import fs

SCHEMA = "dspark-patch/journal/v1"
NAME = ".dspark-patch-journal.json"
LIMIT = 256 << 20   # pre-images of the files a patch changes and their bytecode; vLLM's largest is ~0.3 MiB
_HEX64 = re.compile(r"[0-9a-f]{64}")
_FIXED = "reinstall the release into this folder, then remove the journal"


@dataclass(frozen=True, kw_only=True)
class Entry:
    path: str                 # relative to the tree
    pre: bytes | None         # what was there before the run (None: nothing)
    pre_sha256: str | None
    post_sha256: str | None   # what the run puts there (None: nothing; for bytecode: not known)
    mode: int                 # the file's permission bits (kept by every write)
    bytecode: bool = False    # a .pyc the compile step replaces; derived from its source


@dataclass(frozen=True, kw_only=True)
class Journal:
    diff_sha256: str
    entries: tuple[Entry, ...]
    made: tuple[str, ...] = ()     # folders the write made, outermost first
    pids: tuple[int, ...] = ()     # processes whose temporary files may be ours

    @property
    def sources(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if not e.bytecode)

    @property
    def bytecode(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.bytecode)


def path_of(root: Path) -> Path:
    return root / NAME


def exists(root: Path) -> bool:
    return path_of(root).is_symlink() or path_of(root).exists()


def own_leftovers(root: Path, names: tuple[str, ...]) -> list[Path]:
    """Temporary files of ours (ownfiles.py names them `.NAME.PID.N.dspark-tmp`, NAME cut at 64
    characters) that a run killed while writing the files `names` of the site folder left."""
    wanted = re.compile("|".join(rf"\.{re.escape(n[:64])}\.[0-9]+\.[0-9]+\.dspark-tmp" for n in names))
    found = []
    with os.scandir(root) as entries:
        for entry in entries:
            if wanted.fullmatch(entry.name) and entry.is_file(follow_symlinks=False):
                found.append(Path(entry.path))
    return sorted(found)


def write(root: Path, journal: Journal) -> None:
    """Put `journal` in place atomically, never through a link (BadInput for a link or folder there)."""
    try:
        with ownfiles.open_folder(root, create=False) as folder:
            folder.write(NAME, _encode(journal))
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write the journal {path_of(root)}: {exc.strerror or exc}",
                                 hint="apply writes into the site folder it patches: run it as a user who can "
                                 "(in an image whose USER cannot, as root: `docker run --user 0`, a CI job's "
                                 "securityContext runAsUser: 0, a Dockerfile's USER root before the RUN)") from None


def remove(root: Path) -> None:
    try:
        with ownfiles.open_folder(root, create=False) as folder:
            folder.remove(NAME)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot remove the journal {path_of(root)}: {exc.strerror or exc}") from None


def read(root: Path) -> Journal | None:
    """The journal in `root` (None: there is none); BadJournal for anything but a valid one."""
    shown = path_of(root)
    try:
        with ownfiles.open_folder(root, create=False) as folder:
            data = folder.read(NAME, limit=LIMIT)
    except BadJournal:
        raise
    except BadInput as exc:  # a link, not a regular file, too large, unreadable
        raise _bad(shown, exc.message.removeprefix(f"file {shown}: ").removeprefix(f"{shown}: ")) from None
    if data is None:
        return None
    try:
        doc = json.loads(data.decode("utf-8"))
        return _decode(root, doc)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise _bad(shown, f"not JSON ({type(exc).__name__ if isinstance(exc, RecursionError) else exc})") from None
    except (KeyError, TypeError, AttributeError, binascii.Error) as exc:
        raise _bad(shown, f"not a journal of this tool ({type(exc).__name__}: {exc})") from None
    except DsparkPatchError as exc:
        raise _bad(shown, exc.message) from None


def _bad(shown: Path, why: str) -> BadJournal:
    return BadJournal(f"the journal of an interrupted apply, {shown}: {why[:300]}; nothing was changed",
                      hint=_FIXED)


def _encode(journal: Journal) -> bytes:
    doc = {
        "schema": SCHEMA,
        "diff_sha256": journal.diff_sha256,
        "made": list(journal.made),
        "pids": list(journal.pids),
        "entries": [{
            "path": e.path, "bytecode": e.bytecode, "mode": e.mode,
            "pre_sha256": e.pre_sha256, "post_sha256": e.post_sha256,
            "pre": None if e.pre is None else base64.b64encode(e.pre).decode("ascii"),
        } for e in journal.entries],
    }
    return json.dumps(doc, indent=1).encode("utf-8")


def _decode(root: Path, doc: Any) -> Journal:
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        raise TypeError(f"schema is not {SCHEMA}")
    entries = tuple(_entry(root, e) for e in _list(doc["entries"]))
    if not entries or len({e.path for e in entries}) != len(entries):
        raise TypeError("it names no file, or a file twice")
    made = tuple(_path(root, p) for p in _list(doc["made"]))
    added = [e.path for e in entries if e.pre is None and not e.bytecode]
    if not all(any(a.startswith(folder + "/") for a in added) for folder in made):
        raise TypeError("it names a folder the write made that holds no file it added")
    pids = tuple(doc["pids"])
    if not all(type(p) is int and p > 0 for p in pids):
        raise TypeError("pids are not process ids")
    return Journal(diff_sha256=_hex(doc["diff_sha256"]), entries=entries, made=made, pids=pids)


def _entry(root: Path, e: Any) -> Entry:
    if not isinstance(e, dict):
        raise TypeError("an entry is not an object")
    path = _path(root, e["path"])
    pre_sha256, post_sha256 = _hex_or_none(e["pre_sha256"]), _hex_or_none(e["post_sha256"])
    pre = None if e["pre"] is None else base64.b64decode(str(e["pre"]), validate=True)
    if (pre is None) != (pre_sha256 is None) or (pre is not None and hashlib.sha256(pre).hexdigest() != pre_sha256):
        raise TypeError(f"{path}: the pre-image it holds is not the one whose sha256 it records")
    bytecode, mode = e["bytecode"], e["mode"]
    if type(bytecode) is not bool or type(mode) is not int or not 0 <= mode <= 0o7777:
        raise TypeError(f"{path}: bytecode or mode is malformed")
    if not bytecode and pre_sha256 == post_sha256:
        raise TypeError(f"{path}: pre- and post-image are the same")
    return Entry(path=path, pre=pre, pre_sha256=pre_sha256, post_sha256=post_sha256, mode=mode, bytecode=bytecode)


def _path(root: Path, value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError("a path is not a string")
    fs.check_relative(value)   # UnsafePatch: absolute, `..`, NUL
    folder, _, _ = value.rpartition("/")
    if folder:
        fs.resolve_inside(root, folder)   # UnsafePatch: through a link out of the tree
    return value


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError("a list is not a list")
    return value


def _hex(value: Any) -> str:
    if not isinstance(value, str) or not _HEX64.fullmatch(value):
        raise TypeError("a sha256 is not 64 hex digits")
    return value


def _hex_or_none(value: Any) -> str | None:
    return None if value is None else _hex(value)
