"""One file of a variant carried to another release: a three-way merge that lands only exactly.

The patch set keeps a variant's diff, not the source release's whole files, so the merge's base
and "ours" are the variant's own view of the file: each hunk's pre-image lines (base) and
post-image lines (ours), in order, with a gap line between hunks standing for the lines the diff
does not show. "Theirs" is the target release's file. `git merge-file` (a maintained diff3) makes
the merge; its result is then held against the project's own zero-fuzz engine: a file lands only
when every hunk places at exact context in the target file and the merge equals applying the
hunks there. Anything else is a conflict, written with markers for a person to resolve — never
a guess: GNU `patch -F3` puts envs.py's new entry after the dict's closing brace on 0.32.0.
"""

from __future__ import annotations

import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..errors import EnvironmentProblem, HunkDoesNotApply
from ..patching.diff import FilePatch, Hunk
from ..patching.place import Placement, apply_hunks, describe_mismatch, matches_anywhere, place_hunks, split_lines

MergeStatus = Literal["landed", "conflict"]

# The labels git writes after the markers; a resolved file must have none of these lines left.
OURS_LABEL = "variant"
THEIRS_LABEL = "target"
_GAP = b"# dspark-patch port: the target's lines between hunk #%d and hunk #%d of the variant\n"
GAP_PREFIX = b"# dspark-patch port: "
_OPENERS = (b"<<<<<<< ", b">>>>>>> ", b"||||||| ")


@dataclass(frozen=True, kw_only=True)
class HunkConflict:
    path: str
    hunk_index: int
    header: str
    reason: str

    def line(self) -> str:
        return f"{self.path}: hunk #{self.hunk_index} ({self.header}): {self.reason}"


@dataclass(frozen=True, kw_only=True)
class FileMerge:
    path: str
    status: MergeStatus
    theirs: bytes                   # the target release's pristine file
    result: bytes                   # landed: the candidate post-image; conflict: with markers
    placements: tuple[Placement, ...] = ()   # landed: where each hunk went (offsets)
    conflicts: tuple[HunkConflict, ...] = ()


def merge_file(file: FilePatch, theirs: bytes) -> FileMerge:
    """Carry one modified file of the variant onto the target's `theirs`; pure but for git."""
    base, ours = sparse_sides(file.hunks)
    merged, clean = git_merge_file(ours=ours, base=base, theirs=theirs)
    lines = split_lines(theirs)
    try:
        placements = place_hunks(lines, file.hunks, path=file.path)
    except HunkDoesNotApply as exc:
        conflicts = _hunk_conflicts(file, lines, exc)
        return FileMerge(path=file.path, status="conflict", theirs=theirs,
                         result=merged if not clean else _whole_file_conflict(merged, theirs), conflicts=conflicts)
    exact = apply_hunks(lines, file.hunks, placements)
    if clean and merged == exact:
        return FileMerge(path=file.path, status="landed", theirs=theirs, result=exact, placements=placements)
    # Every hunk places exactly, yet the merge differs (or conflicts): do not pick one silently.
    why = HunkConflict(path=file.path, hunk_index=file.hunks[0].index, header=file.hunks[0].header,
                       reason="every hunk places at exact context, but the three-way merge gives another result; "
                       "resolve the markers by hand")
    return FileMerge(path=file.path, status="conflict", theirs=theirs,
                     result=merged if not clean else _whole_file_conflict(merged, exact), conflicts=(why,))


def sparse_sides(hunks: tuple[Hunk, ...]) -> tuple[bytes, bytes]:
    """The variant's pre- and post-image as far as its diff knows them (see the module doc)."""
    base: list[bytes] = []
    ours: list[bytes] = []
    for i, hunk in enumerate(hunks):
        if i:
            gap = _GAP % (hunks[i - 1].index, hunk.index)
            base.append(gap)
            ours.append(gap)
        base.extend(_ended(hunk.source_lines))
        ours.extend(_ended(hunk.target_lines))
    return b"".join(base), b"".join(ours)


def _ended(lines: tuple[bytes, ...]) -> tuple[bytes, ...]:
    # A last line without newline would glue onto the gap line that follows it.
    if lines and not lines[-1].endswith(b"\n"):
        return (*lines[:-1], lines[-1] + b"\n")
    return lines


def git_merge_file(*, ours: bytes, base: bytes, theirs: bytes) -> tuple[bytes, bool]:
    """`git merge-file -p`: (the merged bytes, True when there was no conflict)."""
    with tempfile.TemporaryDirectory(prefix="dspark-port-merge-") as tmp:
        paths = {}
        for name, data in (("ours", ours), ("base", base), ("theirs", theirs)):
            paths[name] = Path(tmp) / name
            paths[name].write_bytes(data)
        try:
            done = subprocess.run(
                ["git", "merge-file", "-p", "-L", OURS_LABEL, "-L", "base", "-L", THEIRS_LABEL,
                 str(paths["ours"]), str(paths["base"]), str(paths["theirs"])],
                capture_output=True, timeout=120,
            )
        except FileNotFoundError:
            raise EnvironmentProblem("port needs git (git merge-file makes the three-way merge); it is not on PATH",
                                     hint="install git") from None
    # Exit status: the number of conflicts (capped at 127); negative or > 127 is an error.
    if done.returncode < 0 or done.returncode > 127:
        raise EnvironmentProblem(f"git merge-file failed: {done.stderr.decode('utf-8', 'replace').strip()[:200]}")
    return done.stdout, done.returncode == 0


def _hunk_conflicts(file: FilePatch, lines: list[bytes], error: HunkDoesNotApply) -> tuple[HunkConflict, ...]:
    """One entry per hunk that has no exact place; if each has one alone, the engine's reason."""
    out = []
    for hunk in file.hunks:
        if not matches_anywhere(lines, hunk):
            out.append(HunkConflict(path=file.path, hunk_index=hunk.index, header=hunk.header,
                                    reason=_why(lines, hunk)))
    if out:
        return tuple(out)
    first = file.hunks[0]
    return (HunkConflict(path=file.path, hunk_index=first.index, header=first.header,
                         reason=_short(error.message.removeprefix(f"{file.path}: "))),)


def _why(lines: list[bytes], hunk: Hunk) -> str:
    """Why a hunk has no exact place: the first of its lines the target lacks, or none lack."""
    present = set(lines)
    for kind, text in ((ln.kind, ln.text) for ln in hunk.lines if ln.kind != "+"):
        if text not in present:
            what = "removed" if kind == "-" else "context"
            return f"its {what} line {_shown(text)} is not in the target file"
    return _short(describe_mismatch("", lines, hunk).message)


def _shown(line: bytes) -> str:
    text = line.rstrip(b"\r\n").decode("utf-8", "backslashreplace")
    return repr(text if len(text) <= 60 else text[:60] + "...")


def _short(message: str) -> str:
    # describe_mismatch speaks of applying a patch; here it explains why a hunk did not land.
    text = message.split(" does not apply at zero fuzz: ", 1)[-1]
    return text.removesuffix("; the file differs from the release this patch was made for")


def _whole_file_conflict(ours_side: bytes, theirs_side: bytes) -> bytes:
    """Markers around the whole file: for a merge git calls clean that is not exact."""
    def ended(data: bytes) -> bytes:
        return data if not data or data.endswith(b"\n") else data + b"\n"
    return (b"<<<<<<< " + OURS_LABEL.encode() + b" (git merge-file: clean, but not at exact context)\n"
            + ended(ours_side) + b"=======\n" + ended(theirs_side) + b">>>>>>> " + THEIRS_LABEL.encode() + b"\n")


def leftover_markers(data: bytes) -> list[int]:
    """1-based lines that are still conflict markers or gap lines of a port."""
    out = []
    for number, line in enumerate(split_lines(data), 1):
        bare = line.rstrip(b"\r\n")
        if bare == b"=======" or bare.startswith(GAP_PREFIX) or any(bare.startswith(m) for m in _OPENERS):
            out.append(number)
    return out
