"""The user's own references: `dspark-patch reference add` writes them, every lookup reads them.

They live in `$DSPARK_PATCH_REFERENCES` when it is set, else in
`$XDG_DATA_HOME/dspark-patch/references` (default `~/.local/share/dspark-patch/references`),
one `<dist>-<release>-<wheel tags>.json.gz` each, the shipped ones' name and bytes. Anyone who can
write that folder can change what the tool accepts as the published wheel, so each file is read
as an untrusted one (a regular file, not a link, bounded) and checked whole on load
(references/document.py); a bad one is an error naming it, never skipped. A file is written to a
temporary name in the folder and renamed into place (ownfiles), so a reader never sees half of it.
Names that are not `*.json.gz` (the writer's temporary files start with a dot) are not read.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import ownfiles
from ..errors import BadInput, BadReference, EnvironmentProblem
from .document import MAX_COMPRESSED, split_name

ENV = "DSPARK_PATCH_REFERENCES"


def folder() -> Path:
    """Where the user's references are (the folder need not exist)."""
    explicit = os.environ.get(ENV)
    if explicit:
        return Path(explicit).expanduser()
    data = os.environ.get("XDG_DATA_HOME", "")
    # The XDG spec: a relative XDG_DATA_HOME is invalid and is ignored.
    base = Path(data) if data and os.path.isabs(data) else Path.home() / ".local" / "share"
    return base / "dspark-patch" / "references"


def names() -> list[str]:
    """The reference file names in the folder, sorted; none when the folder is not there."""
    where = folder()
    try:
        entries = os.listdir(where)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise BadReference(f"references folder {where}: cannot be read ({exc.strerror or exc})",
                           hint=f"make it a readable folder, or point {ENV} at one") from None
    return sorted(n for n in entries if split_name(n) is not None)


def read(name: str) -> bytes:
    """The bytes of the user's reference `name` (a regular file, not a link, bounded)."""
    path = folder() / name
    try:
        return ownfiles.read_regular(path, limit=MAX_COMPRESSED, what="reference")
    except BadInput as exc:
        raise BadReference(f"{exc.message}; it is not used", hint=fix_hint(name)) from None


def store(name: str, data: bytes) -> Path:
    """Put `data` at `name` in the folder (made as needed) atomically: temp file, then rename."""
    where = folder()
    try:
        with ownfiles.open_folder(where) as opened:
            return opened.write(name, data)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write {where / name}: {exc.strerror or exc}",
                                 hint=f"check that {where} is writable, or set {ENV}") from None


def fix_hint(name: str) -> str:
    spelled = split_name(name)
    again = f"dspark-patch reference add {spelled[0]}=={spelled[1]}" if spelled else "dspark-patch reference add"
    return f"remove it, or make it again: {again} (with --platform for another platform's wheel)"
