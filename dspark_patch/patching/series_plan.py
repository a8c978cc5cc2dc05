"""A series' plan: each member's diff placed at zero fuzz on the result of the ones before it,
all in memory, before anything is written.

A tree may already carry the first members of the series (an earlier run applied them): the
planner finds how many, walking back from the last of them with each diff in reverse, and
places the rest forward on top. It takes the largest such number that fits, so a tree with the
whole series is already applied and a pristine tree gets every member. What each member saw
before it and left after it is kept per member, for the caller to check each one's reviewed
hashes (the planner only places).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from dspark_patch.errors import HunkDoesNotApply
from dspark_patch.patching.diff import Diff, FileAction
from dspark_patch.patching.plan import FilePlan, PatchPlan, PlanStatus, plan_one_way


@dataclass(frozen=True, kw_only=True)
class MemberPlan:
    name: str
    applied_before: bool          # the tree already carried this member
    plan: PatchPlan               # pre: the file before this member; post: after it


@dataclass(frozen=True, kw_only=True)
class SeriesPlan:
    status: PlanStatus            # "already-applied": the tree carries the whole series
    members: tuple[MemberPlan, ...]
    combined: PatchPlan           # pre: the tree as read; post: after the whole series

    @property
    def files_of(self) -> dict[str, tuple[str, ...]]:
        """Which members change each file, in series order."""
        out: dict[str, list[str]] = {}
        for member in self.members:
            for file in member.plan.files:
                out.setdefault(file.path, []).append(member.name)
        return {path: tuple(names) for path, names in out.items()}


def plan_series(steps: Sequence[tuple[str, Diff]], read: Callable[[str], bytes | None]) -> SeriesPlan:
    """`steps`: each member's name and diff, in series order; `read(path)`: the tree's file (None:
    absent). Raises the HunkDoesNotApply of the first member that fits neither way, named."""
    first_error: HunkDoesNotApply | None = None
    for carried in range(len(steps), -1, -1):
        try:
            return _plan(steps, read, carried)
        except HunkDoesNotApply as exc:
            if carried == 0:
                first_error = exc
    assert first_error is not None
    raise first_error


def _plan(steps: Sequence[tuple[str, Diff]], read: Callable[[str], bytes | None], carried: int) -> SeriesPlan:
    overlay: dict[str, bytes | None] = {}

    def current(path: str) -> bytes | None:
        return overlay[path] if path in overlay else read(path)

    # Back from the last carried member: what the tree was before each of them.
    backward: list[MemberPlan] = []
    for name, diff in reversed(steps[:carried]):
        undone = _placed(name, diff, current, reverse=True, position=len(backward))
        overlay.update({f.path: f.post for f in undone.files})
        # Seen forward, this member took the file from the undone content to what it is now.
        backward.append(MemberPlan(name=name, applied_before=True, plan=_flipped(undone)))
    members = list(reversed(backward))
    overlay.clear()  # the carried members are in the tree: the rest go on top of it as read
    for name, diff in steps[carried:]:
        plan = _placed(name, diff, current, reverse=False, position=len(members))
        overlay.update({f.path: f.post for f in plan.files})
        members.append(MemberPlan(name=name, applied_before=False, plan=plan))
    status: PlanStatus = "already-applied" if carried == len(steps) else "apply"
    return SeriesPlan(status=status, members=tuple(members), combined=_combined(members, read, status))


def _placed(name: str, diff: Diff, read: Callable[[str], bytes | None], *, reverse: bool, position: int) -> PatchPlan:
    try:
        return plan_one_way(diff, read, reverse=reverse)
    except HunkDoesNotApply as exc:
        after = "" if position == 0 or reverse else " (on the result of the patch sets before it)"
        raise HunkDoesNotApply(f"patch set {name}{after}: {exc.message}", hint=exc.hint) from None


def _flipped(undone: PatchPlan) -> PatchPlan:
    files = tuple(FilePlan(path=f.path, action=f.action, pre=f.post, post=f.pre, pre_sha256=f.post_sha256,
                           post_sha256=f.pre_sha256, placements=f.placements) for f in undone.files)
    return PatchPlan(status="already-applied", diff_sha256=undone.diff_sha256, files=files)


def _combined(members: list[MemberPlan], read: Callable[[str], bytes | None], status: PlanStatus) -> PatchPlan:
    """One plan from the tree as read to the series' result: what is written, compiled and layered."""
    final: dict[str, FilePlan] = {}
    for member in members:
        for file in member.plan.files:
            final[file.path] = file
    files = []
    for path, last in final.items():
        pre = read(path)
        post = pre if status == "already-applied" else last.post
        if status == "apply" and pre == post:
            continue  # carried members' files, or a file added and removed again: nothing to write
        action: FileAction = "add" if pre is None else "delete" if post is None else "modify"
        # The hunks this run places (all of them, for a series already in place): never those of
        # members the tree carried before, which are not placed again.
        placed = [m for m in members if status == "already-applied" or not m.applied_before]
        placements = tuple(p for m in placed for f in m.plan.files if f.path == path for p in f.placements)
        files.append(FilePlan(path=path, action=action, pre=pre, post=post,
                              pre_sha256=_sha(pre), post_sha256=_sha(post), placements=placements))
    digest = hashlib.sha256("\n".join(m.plan.diff_sha256 for m in members).encode()).hexdigest()
    return PatchPlan(status=status, diff_sha256=digest, files=tuple(files))


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()
