"""Zero-fuzz placement of hunks in a file's lines, and building the patched file from them.

Every context and removed line must match byte for byte. A hunk is looked for first where its
header (plus the offset of the hunk before it) says, then at the nearest position where it
matches exactly, like GNU `patch -F0`. Unlike GNU patch we never guess: two equally near
matches, or a hunk that would land on or before the previous one, is an error.

Like GNU patch, a hunk with less leading than trailing context that starts at line 1 can only
sit at the start of the file, and one with less trailing than leading context only at the end:
`diff` trims context only at the edges of a file, so anywhere else it would be a different place.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from dspark_patch.errors import HunkDoesNotApply
from dspark_patch.patching.diff import Hunk

_SHOWN_CHARS = 60


@dataclass(frozen=True, kw_only=True)
class Placement:
    hunk_index: int
    source_start: int  # from the header (1-based)
    applied_at: int  # 1-based line where the hunk's source lines were found
    offset: int  # applied_at - source_start
    fuzz: int = 0  # always 0: we never fuzz


def split_lines(data: bytes) -> list[bytes]:
    """A file's lines with their own endings. Only b"\\n" ends a line: a lone b"\\r" is an
    ordinary byte to diff and patch, while bytes.splitlines would split there."""
    if b"\r" not in data:
        return data.splitlines(keepends=True)  # same result, without a Python-level loop
    lines = data.split(b"\n")
    last = lines.pop()
    out = [line + b"\n" for line in lines]
    if last:
        out.append(last)
    return out


def sides(hunk: Hunk, *, reverse: bool = False) -> tuple[tuple[bytes, ...], tuple[bytes, ...], int, int]:
    """(lines that must be there, lines that replace them, header start, header length)."""
    if reverse:
        return hunk.target_lines, hunk.source_lines, hunk.target_start, hunk.target_length
    return hunk.source_lines, hunk.target_lines, hunk.source_start, hunk.source_length


def _header_index(start: int, length: int) -> int:
    # "-5,3" covers lines 5..7 (index 4); "-5,0" inserts after line 5 (index 5).
    return start - 1 if length > 0 else start


class _LineIndex:
    """Positions of each distinct line, built on first need (most hunks match at their header)."""

    def __init__(self, lines: Sequence[bytes]) -> None:
        self._lines = lines
        self._positions: dict[bytes, list[int]] | None = None

    def positions(self, line: bytes) -> list[int]:
        if self._positions is None:
            positions: dict[bytes, list[int]] = {}
            for i, text in enumerate(self._lines):
                positions.setdefault(text, []).append(i)
            self._positions = positions
        return self._positions.get(line, [])


def _all_matches(lines: Sequence[bytes], source: tuple[bytes, ...], index: _LineIndex) -> list[int]:
    n = len(source)
    best_offset = 0
    best: list[int] | None = None
    for i, text in enumerate(source):
        found = index.positions(text)
        if best is None or len(found) < len(best):
            best, best_offset = found, i
            if not found:
                return []
    assert best is not None
    out = []
    for q in best:
        p = q - best_offset
        if p >= 0 and tuple(lines[p : p + n]) == source:
            out.append(p)
    return out


class _Miss(Exception):
    """Why one hunk found no place; turned into a HunkDoesNotApply with the file's name."""


def _anchor(hunk: Hunk, lines: Sequence[bytes], n: int, start: int) -> int | None:
    if hunk.leading_context < hunk.trailing_context and start <= 1:
        return 0
    if hunk.trailing_context < hunk.leading_context:
        return len(lines) - n
    return None


def _pin_note(hunk: Hunk, start: int) -> str:
    if hunk.leading_context < hunk.trailing_context and start <= 1:
        return " (it has less context above than below, which pins it to the start of the file)"
    if hunk.trailing_context < hunk.leading_context:
        return " (it has less context below than above, which pins it to the end of the file)"
    return ""


def _locate(
    lines: Sequence[bytes],
    hunk: Hunk,
    *,
    reverse: bool,
    expected: int,
    floor: int,
    index: _LineIndex,
) -> int:
    source, _target, start, _length = sides(hunk, reverse=reverse)
    n = len(source)
    if n == 0:  # pure insertion without context: it goes where the header says
        if expected > len(lines) or expected < 0:
            raise _Miss(f"it inserts after line {expected} but the file has only {len(lines)} lines")
        if expected < floor:
            raise _Miss(f"it would land inside the hunk before it (at line {expected})")
        return expected
    anchor = _anchor(hunk, lines, n, start)
    if anchor is not None:
        if anchor < 0 or tuple(lines[anchor : anchor + n]) != source:
            raise _Miss(_difference(lines, source, anchor if anchor >= 0 else expected) + _pin_note(hunk, start))
        found = anchor
    elif 0 <= expected and tuple(lines[expected : expected + n]) == source:
        found = expected  # the hot path: a real release diff mostly matches right where it says
    else:
        candidates = _all_matches(lines, source, index)
        if not candidates:
            raise _Miss(_difference(lines, source, expected))
        distance = min(abs(p - expected) for p in candidates)
        nearest = [p for p in candidates if abs(p - expected) == distance]
        if len(nearest) > 1:
            a, b = nearest[0] + 1, nearest[1] + 1
            raise _Miss(
                f"it matches equally well at line {a} and line {b} ({distance} lines from where expected); "
                "refusing to guess"
            )
        found = nearest[0]
    if found < floor:
        raise _Miss(f"its only exact match, at line {found + 1}, overlaps or precedes the hunk before it")
    return found


def _show(line: bytes) -> str:
    text = line[:-1] if line.endswith(b"\n") else line
    shown = text.decode("utf-8", "backslashreplace")
    if len(shown) > _SHOWN_CHARS:
        shown = shown[:_SHOWN_CHARS] + "..."
    return repr(shown)


def _ending(line: bytes) -> str:
    for ending, name in ((b"\r\n", "CRLF"), (b"\n", "LF")):
        if line.endswith(ending):
            return name
    return "no newline"


def _difference(lines: Sequence[bytes], source: tuple[bytes, ...], at: int) -> str:
    """The first line that differs between the file and the hunk, put where the hunk was expected."""
    at = max(at, 0)
    for i, want in enumerate(source):
        pos = at + i
        if pos >= len(lines):
            return f"the file ends after line {len(lines)} where the patch expects {_show(want)}"
        if lines[pos] != want:
            have = lines[pos]
            if have.rstrip(b"\r\n") == want.rstrip(b"\r\n"):
                return (
                    f"line {pos + 1} ends with {_ending(have)} where the patch expects {_ending(want)}"
                )
            return f"line {pos + 1} is {_show(have)} where the patch expects {_show(want)}"
    return f"its lines match at line {at + 1} only"


def describe_mismatch(path: str, lines: Sequence[bytes], hunk: Hunk, *, offset: int = 0) -> HunkDoesNotApply:
    """The error for a hunk that matches nowhere, showing the first differing line at its header position."""
    source, _target, start, length = sides(hunk)
    at = _header_index(start, length) + offset
    anchor = _anchor(hunk, lines, len(source), start) if source else None
    if anchor is not None and anchor >= 0:
        at = anchor
    return _error(path, hunk, _difference(lines, source, at) + _pin_note(hunk, start))


def _error(path: str, hunk: Hunk, reason: str) -> HunkDoesNotApply:
    prefix = f"{path}: " if path else ""
    return HunkDoesNotApply(
        f"{prefix}hunk #{hunk.index} ({hunk.header}) does not apply at zero fuzz: {reason}; "
        "the file differs from the release this patch was made for",
        hint="use the patch variant made for this release, or check that the tree is unmodified",
    )


def place_hunks(
    lines: Sequence[bytes], hunks: Sequence[Hunk], *, reverse: bool = False, path: str = ""
) -> tuple[Placement, ...]:
    """Place every hunk, in file order, at zero fuzz; raise HunkDoesNotApply naming the first that fails.

    With reverse=True the hunks are looked for as already applied (their target lines).
    """
    index = _LineIndex(lines)
    placements: list[Placement] = []
    last_offset = 0
    floor = 0
    for hunk in hunks:
        source, _target, start, length = sides(hunk, reverse=reverse)
        header = _header_index(start, length)
        try:
            found = _locate(lines, hunk, reverse=reverse, expected=header + last_offset, floor=floor, index=index)
        except _Miss as miss:
            raise _error(path, hunk, str(miss)) from None
        last_offset = found - header
        floor = found + len(source)
        placements.append(
            Placement(hunk_index=hunk.index, source_start=start, applied_at=start + last_offset, offset=last_offset)
        )
    return tuple(placements)


def matches_anywhere(lines: Sequence[bytes], hunk: Hunk, *, reverse: bool = False) -> bool:
    """Whether the hunk's lines occur exactly somewhere (for telling applied from unapplied hunks)."""
    source, _target, start, _length = sides(hunk, reverse=reverse)
    if not source:
        return False  # an insertion without context proves nothing either way
    anchor = _anchor(hunk, lines, len(source), start)
    if anchor is not None:
        return anchor >= 0 and tuple(lines[anchor : anchor + len(source)]) == source
    return bool(_all_matches(lines, source, _LineIndex(lines)))


def apply_hunks(
    lines: Sequence[bytes], hunks: Sequence[Hunk], placements: Sequence[Placement], *, reverse: bool = False
) -> bytes:
    """The file's new content: each placed hunk's source lines replaced by its target lines."""
    if len(hunks) != len(placements):
        raise ValueError("one placement per hunk is required")
    out: list[bytes] = []
    cur = 0
    for hunk, placement in zip(hunks, placements, strict=True):
        source, target, start, length = sides(hunk, reverse=reverse)
        at = _header_index(start, length) + placement.offset
        if at < cur or tuple(lines[at : at + len(source)]) != source:
            raise _error("", hunk, f"its placement at line {at + 1} no longer matches the file")
        out.extend(lines[cur:at])
        out.extend(target)
        cur = at + len(source)
    out.extend(lines[cur:])
    return b"".join(out)
