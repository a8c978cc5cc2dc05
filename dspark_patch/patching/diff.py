"""A unified diff, as bytes, turned into our own model: files, hunks, lines with their endings.

python-unidiff does the line grammar; everything that decides what we are willing to touch is
here: path stripping (`patch -pN`), path safety, and refusing what a zero-fuzz text applier
cannot do faithfully (binary, renames, copies, mode changes, symlinks, submodules).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar, cast, overload

from unidiff import Hunk as UnidiffHunk
from unidiff import PatchedFile, PatchSet, UnidiffParseError

from dspark_patch.errors import MalformedPatch, UnsafePatch

LineKind = Literal[" ", "-", "+"]
FileAction = Literal["modify", "add", "delete"]

# unidiff hands us str; the file bytes must come back unchanged, odd bytes included.
_ENCODING = "utf-8"
_ERRORS = "surrogateescape"

# Lines that can only be diff headers (a hunk line starts with " ", "+", "-" or "\"), so a raw
# scan finds them even where unidiff would attach them to no file at all.
_RAW_BINARY = re.compile(rb"^(?:GIT binary patch|Binary files? .* (?:differ|has changed))\r?$", re.M)
_REFUSED_INFO = {
    "rename from ": "a rename",
    "rename to ": "a rename",
    "copy from ": "a copy",
    "copy to ": "a copy",
}
_DEV_NULL = "/dev/null"  # the path diff gives the missing side of an added or deleted file
_SYMLINK_MODE = "120000"
_SUBMODULE_MODE = "160000"
_PLAIN_FILE_MODE = "100644"


_T = TypeVar("_T")


class _cached(Generic[_T]):
    """functools.cached_property without the lock it takes on every first access in Python 3.11
    (dropped in 3.12): planning a release diff computes ~4x10^4 of these."""

    def __init__(self, func: Callable[[Any], _T]) -> None:
        self.func = func
        self.__doc__ = func.__doc__

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type | None = None) -> _cached[_T]: ...
    @overload
    def __get__(self, instance: object, owner: type | None = None) -> _T: ...
    def __get__(self, instance: object, owner: type | None = None) -> _T | _cached[_T]:
        if instance is None:
            return self
        # The instance dict, not setattr: the dataclass is frozen (as cached_property does it).
        value = instance.__dict__[self.name] = self.func(instance)
        return value


@dataclass(frozen=True, kw_only=True, slots=True)  # slots: a release diff has ~10^5 of these
class HunkLine:
    kind: LineKind
    text: bytes  # the line with its own ending (b"\n", b"\r\n", or none at EOF)


@dataclass(frozen=True, kw_only=True)
class Hunk:
    index: int  # 1-based position within its file, for messages ("hunk #2")
    source_start: int
    source_length: int
    target_start: int
    target_length: int
    section: str  # text after the second @@ (function name), for messages
    lines: tuple[HunkLine, ...]

    @_cached
    def source_lines(self) -> tuple[bytes, ...]:
        """Context and removed lines: what must be in the file before."""
        return tuple([line.text for line in self.lines if line.kind != "+"])

    @_cached
    def target_lines(self) -> tuple[bytes, ...]:
        """Context and added lines: what is in the file after."""
        return tuple([line.text for line in self.lines if line.kind != "-"])

    @_cached
    def leading_context(self) -> int:
        n = 0
        for line in self.lines:
            if line.kind != " ":
                break
            n += 1
        return n

    @_cached
    def trailing_context(self) -> int:
        n = 0
        for line in reversed(self.lines):
            if line.kind != " ":
                break
            n += 1
        return n

    @property
    def header(self) -> str:
        """The hunk's @@ line, for messages."""
        head = f"@@ -{self.source_start},{self.source_length} +{self.target_start},{self.target_length} @@"
        return f"{head} {self.section}" if self.section else head


@dataclass(frozen=True, kw_only=True)
class FilePatch:
    path: str  # posix, relative, after --strip, validated safe
    action: FileAction
    hunks: tuple[Hunk, ...]


@dataclass(frozen=True, kw_only=True)
class Diff:
    files: tuple[FilePatch, ...]
    sha256: str  # of the raw diff bytes


def parse_diff(data: bytes, *, strip: int = 1) -> Diff:
    """Parse a unified diff (plain `diff -u` or git) into files and hunks; refuse what we cannot apply.

    Raises MalformedPatch for input that is not a usable diff and UnsafePatch for changes we
    refuse on purpose.
    """
    if strip < 0:
        raise MalformedPatch(f"--strip must be 0 or more, not {strip}")
    if not data.strip():
        raise MalformedPatch("the diff is empty", hint="pass a unified diff (diff -u or git diff output)")
    if b"\0" in data:
        line_no = data.count(b"\n", 0, data.index(b"\0")) + 1
        raise UnsafePatch(
            f"the diff contains a NUL byte (diff line {line_no})",
            hint="binary content cannot be applied as text; pass a text unified diff",
        )
    # The regex is only run where a cheap substring search says it could match (big diffs).
    binary = _RAW_BINARY.search(data) if b"GIT binary patch" in data or b"Binary file" in data else None
    if binary:
        line_no = data.count(b"\n", 0, binary.start()) + 1
        raise UnsafePatch(
            f"the diff contains a binary change (diff line {line_no}: "
            f"{binary.group(0).decode(_ENCODING, 'backslashreplace').strip()!r})",
            hint="only text changes can be applied at zero fuzz; remove the binary part",
        )
    patchset = _unidiff(data)
    if not patchset:
        raise MalformedPatch(
            "no file changes found in the input",
            hint="pass a unified diff with ---/+++ headers and @@ hunks",
        )
    interned: _Interned = {" ": {}, "-": {}, "+": {}}
    files = tuple(_file_patch(patched, strip, interned) for patched in patchset)
    seen: set[str] = set()
    for file in files:
        if file.path in seen:
            raise MalformedPatch(f"{file.path}: the diff changes this file twice", hint="merge its hunks into one entry")
        seen.add(file.path)
    return Diff(files=files, sha256=hashlib.sha256(data).hexdigest())


def _file_patch(patched: PatchedFile, strip: int, interned: _Interned) -> FilePatch:
    source_raw = _unquote(patched.source_file or "")
    target_raw = _unquote(patched.target_file or "")
    shown = target_raw if target_raw != _DEV_NULL else source_raw

    if patched.is_binary_file:
        raise UnsafePatch(f"{shown}: binary change", hint="only text changes can be applied; remove this file from the diff")
    for info in patched.patch_info or ():
        for prefix, what in _REFUSED_INFO.items():
            if info.startswith(prefix):
                raise UnsafePatch(f"{shown}: the diff is {what} ({info.strip()!r})", hint="express it as a delete and an add, or leave it out")
    _check_modes(patched, shown)
    if len(patched) == 0:
        raise MalformedPatch(f"{shown}: no hunks for this file", hint="every file in the diff needs at least one @@ hunk")

    hunks = tuple(_hunk(h, i, shown, interned) for i, h in enumerate(patched, start=1))

    if source_raw == _DEV_NULL and target_raw == _DEV_NULL:
        raise MalformedPatch(f"{shown}: both sides of the diff are /dev/null")
    only = hunks[0] if len(hunks) == 1 else None
    adds = source_raw == _DEV_NULL or (only is not None and only.source_start == 0 and only.source_length == 0)
    deletes = target_raw == _DEV_NULL or (only is not None and only.target_start == 0 and only.target_length == 0)
    if adds and deletes:
        raise MalformedPatch(f"{shown}: the diff both adds and deletes this file")

    if adds:
        path = _strip(target_raw, strip)
        if source_raw != _DEV_NULL and _strip(source_raw, strip) != path:
            raise UnsafePatch(f"{shown}: source and target paths differ (a rename)", hint="renames are not applied")
        action: FileAction = "add"
        _check_whole_file(hunks, path, kind="+", what="add")
    elif deletes:
        path = _strip(source_raw, strip)
        if target_raw != _DEV_NULL and _strip(target_raw, strip) != path:
            raise UnsafePatch(f"{shown}: source and target paths differ (a rename)", hint="renames are not applied")
        action = "delete"
        _check_whole_file(hunks, path, kind="-", what="delete")
    else:
        path = _strip(source_raw, strip)
        target_path = _strip(target_raw, strip)
        if target_path != path:
            raise UnsafePatch(
                f"{path}: the diff renames it to {target_path} (source and target paths differ)",
                hint="renames are not applied; diff the file under one name",
            )
        action = "modify"
    return FilePatch(path=path, action=action, hunks=hunks)


def _check_modes(patched: PatchedFile, shown: str) -> None:
    modes = {m for m in (patched.source_mode, patched.target_mode) if m}
    if _SYMLINK_MODE in modes:
        raise UnsafePatch(f"{shown}: the diff changes a symbolic link (mode 120000)", hint="symlinks are not patched")
    if _SUBMODULE_MODE in modes:
        raise UnsafePatch(f"{shown}: the diff changes a submodule (mode 160000)", hint="submodules are not patched")
    info = [line for line in patched.patch_info or () if line.startswith(("old mode ", "new mode "))]
    if info or (patched.source_mode and patched.target_mode and patched.source_mode != patched.target_mode):
        what = "only changes the file mode" if len(patched) == 0 else "changes the file mode"
        raise UnsafePatch(
            f"{shown}: the diff {what} ({patched.source_mode} -> {patched.target_mode})",
            hint="file modes are never changed; remove the old mode/new mode lines",
        )
    new_mode = next((line.split()[-1] for line in patched.patch_info or () if line.startswith("new file mode ")), None)
    if new_mode is not None and new_mode != _PLAIN_FILE_MODE:
        raise UnsafePatch(f"{shown}: the diff adds a file with mode {new_mode}", hint="added files are always created 0644")


def _check_whole_file(hunks: tuple[Hunk, ...], path: str, *, kind: str, what: str) -> None:
    if len(hunks) != 1 or any(line.kind != kind for line in hunks[0].lines):
        raise MalformedPatch(f"{path}: the diff would {what} this file but its hunks are not one whole-file hunk")


# Equal diff lines share one HunkLine (it is immutable): a release diff repeats many lines.
# Keyed by kind, then by the line's text as unidiff gives it (its `Line.value`).
_Interned = dict[str, dict[str, HunkLine]]


def _hunk_line(kind: LineKind, value: str) -> HunkLine:
    text = value.encode(_ENCODING, _ERRORS)
    # Only the diff's very last line can lack its newline (an editor ate it);
    # an intended missing newline is always spelled with the marker.
    return HunkLine(kind=kind, text=text if text[-1:] == b"\n" else text + b"\n")


def _unidiff(data: bytes) -> PatchSet:
    try:
        return PatchSet.from_string(data, encoding=_ENCODING, errors=_ERRORS)
    except UnidiffParseError as exc:
        raise MalformedPatch(f"the diff cannot be parsed: {exc}", hint="check the hunk headers and line counts") from exc
    except Exception as exc:  # noqa: BLE001 - untrusted input: any parser failure is bad input, not our bug
        raise MalformedPatch(f"the diff cannot be parsed: {type(exc).__name__}: {exc}") from exc


def _hunk(hunk: UnidiffHunk, index: int, shown: str, interned: _Interned) -> Hunk:
    lines: list[HunkLine] = []
    for line in hunk:
        kind = line.line_type
        same_kind = interned.get(kind)
        if same_kind is not None:  # a context, removed or added line
            value = line.value
            entry = same_kind.get(value)
            if entry is None:
                entry = same_kind[value] = _hunk_line(cast(LineKind, kind), value)
            lines.append(entry)
        elif kind == "\\":
            # "\ No newline at end of file" refers to the line before it; a context line lacks
            # its newline on both sides, so stripping it here serves source and target alike.
            if not lines or not lines[-1].text.endswith(b"\n"):
                raise MalformedPatch(f"{shown}: hunk #{index} has a stray '\\ No newline at end of file' marker")
            last = lines[-1]
            lines[-1] = HunkLine(kind=last.kind, text=last.text[:-1])
        # "" is a blank separator line unidiff keeps after a hunk: not part of the file.
    return Hunk(
        index=index,
        source_start=hunk.source_start,
        source_length=hunk.source_length,
        target_start=hunk.target_start,
        target_length=hunk.target_length,
        section=hunk.section_header.rstrip("\r\n"),
        lines=tuple(lines),
    )


_GIT_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(raw: str) -> str:
    """Undo git's C-style quoting of unusual paths ("a/caf\\303\\251.py")."""
    raw = raw.rstrip("\r")  # a diff saved with CRLF line endings
    if not (len(raw) >= 2 and raw.startswith('"') and raw.endswith('"')):
        return raw
    body = raw[1:-1]
    out = bytearray()
    i = 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out += ch.encode(_ENCODING, _ERRORS)
            i += 1
            continue
        nxt = body[i + 1 : i + 2]
        if nxt in _GIT_ESCAPES:
            out.append(_GIT_ESCAPES[nxt])
            i += 2
        elif len(body) >= i + 4 and all(c in "01234567" for c in body[i + 1 : i + 4]):
            out.append(int(body[i + 1 : i + 4], 8) & 0xFF)
            i += 4
        else:
            raise MalformedPatch(f"bad escape in quoted path {raw!r}")
    return out.decode(_ENCODING, _ERRORS)


def _strip(raw: str, strip: int) -> str:
    """Drop the first `strip` components, like `patch -pN`; refuse paths that could escape the tree."""
    if "\0" in raw:
        raise UnsafePatch(f"path {raw!r} contains a NUL byte")
    if not raw:
        raise MalformedPatch("a file header has no path")
    if raw.startswith("/"):
        raise UnsafePatch(f"{raw}: absolute path in the diff", hint="paths must be relative to the tree")
    parts = [p for p in raw.split("/") if p]
    if ".." in parts:
        raise UnsafePatch(f"{raw}: path contains '..'", hint="paths must stay inside the tree")
    if len(parts) <= strip:
        raise MalformedPatch(
            f"{raw}: path has {len(parts)} component(s), too few to strip {strip}",
            hint="use a smaller --strip (e.g. 0 for a diff without a/ b/ prefixes)",
        )
    kept = [p for p in parts[strip:] if p != "."]
    if not kept:
        raise MalformedPatch(f"{raw}: nothing left of the path after stripping {strip} component(s)")
    path = "/".join(kept)
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in path):
        # a newline or escape in a name would print as a second line (a forged verdict) in the output
        raise UnsafePatch(f"path {path!r} contains a control character", hint="rename the file in the diff")
    startup = _startup_file(kept)
    if startup is not None:
        raise UnsafePatch(f"{path}: {startup}, which the interpreter runs at every start; a patch set never changes one",
                          hint="patch the distribution's own modules instead")
    return path


# Start-up files: a `.pth` line starting with `import` runs at every interpreter start, and so do
# the `sitecustomize`/`usercustomize` modules (site.py); none is ever a distribution's module.
_STARTUP_MODULES = frozenset({"sitecustomize", "usercustomize"})


def _startup_file(parts: list[str]) -> str | None:
    name = parts[-1]
    if name.endswith(".pth"):
        return "a .pth file"
    for part in parts:
        if part.split(".", 1)[0] in _STARTUP_MODULES:
            return f"a {part.split('.', 1)[0]} module"
    return None


__all__ = [
    "Diff",
    "FileAction",
    "FilePatch",
    "Hunk",
    "HunkLine",
    "LineKind",
    "parse_diff",
]
