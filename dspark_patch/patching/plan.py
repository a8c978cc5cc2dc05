"""The all-or-nothing plan: every file's new content, computed in memory before anything is written.

A patch either applies forward to every file, or is already applied to every file (each hunk
found in reverse), or the plan fails: a tree where some hunks are applied and others not is
reported as partly applied, never finished off or undone.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from dspark_patch.errors import HunkDoesNotApply, PartlyApplied
from dspark_patch.patching.diff import Diff, FileAction, FilePatch, Hunk
from dspark_patch.patching.place import (
    Placement,
    apply_hunks,
    describe_mismatch,
    matches_anywhere,
    place_hunks,
    split_lines,
)

PlanStatus = Literal["apply", "already-applied"]
_Direction = Literal["forward", "reverse"]


@dataclass(frozen=True, kw_only=True)
class FilePlan:
    path: str
    action: FileAction
    pre: bytes | None  # None when the file is added
    post: bytes | None  # None when the file is deleted
    pre_sha256: str | None
    post_sha256: str | None
    placements: tuple[Placement, ...]


@dataclass(frozen=True, kw_only=True)
class PatchPlan:
    status: PlanStatus
    diff_sha256: str
    files: tuple[FilePlan, ...]  # for already-applied: pre == post == current content, placements of the reverse match


@dataclass(frozen=True, kw_only=True)
class _FileOutcome:
    direction: _Direction
    plan: FilePlan


def plan_patch(diff: Diff, read: Callable[[str], bytes | None], *, applied_first: bool = False) -> PatchPlan:
    """Plan the whole diff against the files `read(path)` returns (None: the file does not exist).

    `applied_first`: the caller knows the files are the reviewed post-images, so a changed file
    is matched in reverse first (a hunk whose context still fits after it was applied would
    otherwise apply a second time).

    Raises HunkDoesNotApply for the first hunk that fits neither forward nor in reverse, and
    PartlyApplied when some hunks are applied and others not.
    """
    outcomes = [_plan_file(file, read(file.path), applied_first) for file in diff.files]
    directions = {o.direction for o in outcomes}
    if directions == {"forward", "reverse"}:
        applied = [f"{o.plan.path} {_numbers(f.hunks)}" for o, f in zip(outcomes, diff.files, strict=True) if o.direction == "reverse"]
        pending = [f"{o.plan.path} {_numbers(f.hunks)}" for o, f in zip(outcomes, diff.files, strict=True) if o.direction == "forward"]
        raise _partly(applied, pending)
    status: PlanStatus = "already-applied" if directions == {"reverse"} else "apply"
    return PatchPlan(status=status, diff_sha256=diff.sha256, files=tuple(o.plan for o in outcomes))


def _plan_file(file: FilePatch, current: bytes | None, applied_first: bool) -> _FileOutcome:
    match file.action:
        case "add":
            return _plan_add(file, current)
        case "delete":
            return _plan_delete(file, current)
        case "modify":
            return _plan_modify(file, current, applied_first)


def _plan_modify(file: FilePatch, current: bytes | None, applied_first: bool = False) -> _FileOutcome:
    if current is None:
        raise HunkDoesNotApply(
            f"{file.path}: the patch changes this file but it does not exist in the tree",
            hint="check the target and --strip; the file differs from the release this patch was made for",
        )
    lines = split_lines(current)
    if applied_first:
        try:
            placements = place_hunks(lines, file.hunks, reverse=True, path=file.path)
        except HunkDoesNotApply:
            pass
        else:
            return _FileOutcome(direction="reverse", plan=_file_plan(file, current, current, placements))
    try:
        placements = place_hunks(lines, file.hunks, path=file.path)
    except HunkDoesNotApply as forward_error:
        try:
            placements = place_hunks(lines, file.hunks, reverse=True, path=file.path)
        except HunkDoesNotApply:
            raise _explain(file, lines, forward_error) from None
        return _FileOutcome(direction="reverse", plan=_file_plan(file, current, current, placements))
    post = apply_hunks(lines, file.hunks, placements)
    return _FileOutcome(direction="forward", plan=_file_plan(file, current, post, placements))


def _explain(file: FilePatch, lines: list[bytes], forward_error: HunkDoesNotApply) -> Exception:
    """Neither direction fits the whole file: a hunk that fits nowhere, or a mix of applied and not."""
    forward = [matches_anywhere(lines, h) for h in file.hunks]
    reverse = [matches_anywhere(lines, h, reverse=True) for h in file.hunks]
    for hunk, fwd, rev in zip(file.hunks, forward, reverse, strict=True):
        if not fwd and not rev:
            return describe_mismatch(file.path, lines, hunk)
    applied = [h for h, fwd, rev in zip(file.hunks, forward, reverse, strict=True) if rev and not fwd]
    pending = [h for h, fwd, rev in zip(file.hunks, forward, reverse, strict=True) if fwd and not rev]
    if applied and pending:
        return _partly([f"{file.path} {_numbers(applied)}"], [f"{file.path} {_numbers(pending)}"])
    return forward_error


def _plan_add(file: FilePatch, current: bytes | None) -> _FileOutcome:
    hunk = file.hunks[0]
    content = b"".join(hunk.target_lines)
    if not current:
        # An empty file stands where "-0,0" says there is nothing, as GNU patch sees it too.
        placement = Placement(hunk_index=hunk.index, source_start=hunk.source_start, applied_at=0, offset=0)
        return _FileOutcome(direction="forward", plan=_file_plan(file, current, content, (placement,)))
    if current == content:
        placement = Placement(hunk_index=hunk.index, source_start=hunk.target_start, applied_at=hunk.target_start, offset=0)
        return _FileOutcome(direction="reverse", plan=_file_plan(file, current, current, (placement,)))
    raise _whole_file_mismatch(file, hunk, current, hunk.target_lines, "adds this file but it already exists with other content")


def _plan_delete(file: FilePatch, current: bytes | None) -> _FileOutcome:
    hunk = file.hunks[0]
    content = b"".join(hunk.source_lines)
    if current is None:
        placement = Placement(hunk_index=hunk.index, source_start=hunk.target_start, applied_at=0, offset=0)
        return _FileOutcome(direction="reverse", plan=_file_plan(file, None, None, (placement,)))
    if current == content:
        placement = Placement(hunk_index=hunk.index, source_start=hunk.source_start, applied_at=hunk.source_start, offset=0)
        return _FileOutcome(direction="forward", plan=_file_plan(file, current, None, (placement,)))
    raise _whole_file_mismatch(file, hunk, current, hunk.source_lines, "deletes this file but its content differs")


def _whole_file_mismatch(
    file: FilePatch, hunk: Hunk, current: bytes, expected: tuple[bytes, ...], what: str
) -> HunkDoesNotApply:
    reason = _first_difference(split_lines(current), expected)
    return HunkDoesNotApply(
        f"{file.path}: hunk #{hunk.index} ({hunk.header}) {what}: {reason}",
        hint="remove or restore the file, or use the patch variant made for this release",
    )


def _first_difference(lines: list[bytes], expected: tuple[bytes, ...]) -> str:
    for i, want in enumerate(expected):
        if i >= len(lines):
            return f"the file ends after line {len(lines)} where the patch has {_shown(want)}"
        if lines[i] != want:
            return f"line {i + 1} is {_shown(lines[i])} where the patch has {_shown(want)}"
    return f"the file goes on after line {len(expected)}, where the patch ends"


def _shown(line: bytes) -> str:
    text = line[:-1] if line.endswith(b"\n") else line
    shown = text.decode("utf-8", "backslashreplace")
    return repr(shown[:60] + "..." if len(shown) > 60 else shown)


def _file_plan(file: FilePatch, pre: bytes | None, post: bytes | None, placements: tuple[Placement, ...]) -> FilePlan:
    return FilePlan(
        path=file.path,
        action=file.action,
        pre=pre,
        post=post,
        pre_sha256=None if pre is None else hashlib.sha256(pre).hexdigest(),
        post_sha256=None if post is None else hashlib.sha256(post).hexdigest(),
        placements=placements,
    )


def _numbers(hunks: tuple[Hunk, ...] | list[Hunk]) -> str:
    label = "hunk" if len(hunks) == 1 else "hunks"
    return f"{label} " + ", ".join(f"#{h.index}" for h in hunks)


def _partly(applied: list[str], pending: list[str]) -> PartlyApplied:
    return PartlyApplied(
        f"the patch is partly applied: already applied: {'; '.join(applied)}; not applied: {'; '.join(pending)}",
        hint="restore the original files (or reinstall the release) and apply again",
    )


def plan_one_way(diff: Diff, read: Callable[[str], bytes | None], *, reverse: bool = False) -> PatchPlan:
    """The whole diff placed in one direction only: forward (every file's hunks applied), or in
    reverse (every file's hunks taken out again, `post` being the file before the diff). Raises
    HunkDoesNotApply for the first file that does not fit that way. A series (series_plan.py)
    walks its members with this: forward on the result of the sets before, or back from the end."""
    files = tuple(_one_way(file, read(file.path), reverse) for file in diff.files)
    return PatchPlan(status="apply", diff_sha256=diff.sha256, files=files)


def _one_way(file: FilePatch, current: bytes | None, reverse: bool) -> FilePlan:
    hunk = file.hunks[0]
    creates = file.action == ("delete" if reverse else "add")
    removes = file.action == ("add" if reverse else "delete")
    if creates:
        content = b"".join(hunk.source_lines if reverse else hunk.target_lines)
        if current:
            raise _whole_file_mismatch(file, hunk, current, hunk.source_lines if reverse else hunk.target_lines,
                                       "creates this file but it already exists")
        placement = Placement(hunk_index=hunk.index, source_start=hunk.source_start, applied_at=0, offset=0)
        return _file_plan(file, current, content, (placement,))
    if removes:
        expected = hunk.target_lines if reverse else hunk.source_lines
        if current is None or current != b"".join(expected):
            if current is None:
                raise HunkDoesNotApply(f"{file.path}: the patch removes this file but it does not exist in the tree",
                                       hint="check the order of the series and the release of the tree")
            raise _whole_file_mismatch(file, hunk, current, expected, "removes this file but its content differs")
        placement = Placement(hunk_index=hunk.index, source_start=hunk.source_start, applied_at=hunk.source_start, offset=0)
        return _file_plan(file, current, None, (placement,))
    if current is None:
        raise HunkDoesNotApply(f"{file.path}: the patch changes this file but it does not exist in the tree",
                               hint="check the order of the series and the release of the tree")
    lines = split_lines(current)
    placements = place_hunks(lines, file.hunks, reverse=reverse, path=file.path)
    return _file_plan(file, current, apply_hunks(lines, file.hunks, placements, reverse=reverse), placements)
