"""Which known patch sets an edited tree already carries, for `new` (pipeline/new_set.py).

A team edits a tree that carries the DSpark set, and edits where a person would: its own flag
right under DSpark's in vllm/envs.py. Then no DSpark hunk keeps all of its context, so a set is
not held to "every hunk placed back at exact context" alone: it is looked for hunk by hunk. A
hunk is in the tree when its changed lines are there with the whole of its context on at least
one side of them (an edit may touch the other side), and its pre-image lines are not still there
unchanged; a hunk that only removes lines needs its whole post-image. A set counts as carried
when each of its files is its reviewed post-image or holds every one of its hunks. Nothing here
guesses where a change goes: the new set is diffed from the carried sets' result, and `new`
checks that result plus the new set gives the tree byte for byte (new_set.py: `_check`).

A known set with no variant for the tree's release cannot be looked for (its hunks are another
release's): it is left out, and a note says so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..errors import DsparkPatchError, UnsupportedRelease
from ..patching.diff import Hunk, parse_diff
from ..patching.place import split_lines
from ..patchset import PatchSet
from ..series import state_of


@dataclass(frozen=True, kw_only=True)
class Carried:
    sets: tuple[PatchSet, ...]   # in an order their `requires` allow
    notes: tuple[str, ...]


def for_release(known: Sequence[PatchSet], release: str) -> tuple[list[PatchSet], list[str]]:
    """The known sets that have a variant for `release`, and a note for each one left out."""
    kept: list[PatchSet] = []
    notes: list[str] = []
    for patchset in known:
        try:
            patchset.variant_for(release)
        except UnsupportedRelease:
            covered = ", ".join(r for v in patchset.variants for r in v.releases) or "none"
            notes.append(f"{patchset.id} has no variant for vllm {release} (it covers {covered}): "
                         "left out, not looked for in the tree")
            continue
        kept.append(patchset)
    return kept, notes


def carried(known: Sequence[PatchSet], tree: Mapping[str, bytes], hashes: Mapping[str, str],
            release: str) -> Carried:
    """The sets of `known` (each with a variant for `release`) the tree carries. `tree`: the
    bytes of every file the sets change that the tree has and that is not their post-image."""
    found: list[PatchSet] = []
    notes: list[str] = []
    for patchset in known:
        if state_of(patchset, hashes, release, known) == "applied":
            found.append(patchset)
            continue
        held, total = _hunks_held(patchset, tree, hashes, release)
        if total and held == total:
            found.append(patchset)
        elif held:
            notes.append(f"{patchset.id}: {held} of its {total} hunks are in the tree, not all, so it is not "
                         "counted as carried and the new set holds those lines too")
    return Carried(sets=tuple(_ordered(found)), notes=tuple(notes))


def _ordered(sets: list[PatchSet]) -> list[PatchSet]:
    ordered: list[PatchSet] = []
    todo = list(sets)
    while todo:
        ids = {p.id for p in todo}
        ready = [p for p in todo if not set(p.requires) & ids]
        if not ready:
            break
        ordered.append(ready[0])
        todo.remove(ready[0])
    return ordered


def _hunks_held(patchset: PatchSet, tree: Mapping[str, bytes], hashes: Mapping[str, str],
                release: str) -> tuple[int, int]:
    """(hunks found in the tree, hunks in all), a file at its post-image counting all of its own."""
    try:
        variant = patchset.variant_for(release)
        diff = parse_diff(variant.diff, strip=patchset.strip)
    except DsparkPatchError:
        return 0, 0
    held = total = 0
    for fp in diff.files:
        count = max(len(fp.hunks), 1)
        total += count
        expected = variant.files.get(fp.path)
        if expected is not None and hashes.get(fp.path) == expected.post_sha256:
            held += count
        elif fp.action == "add":
            held += count if fp.path in hashes else 0
        elif fp.action == "delete":
            held += count if fp.path not in hashes else 0
        elif fp.path in tree:
            lines = split_lines(tree[fp.path])
            held += sum(1 for hunk in fp.hunks if hunk_in(lines, hunk))
    return held, total


def hunk_in(lines: Sequence[bytes], hunk: Hunk) -> bool:
    """Whether the file's `lines` hold `hunk`'s change (the module doc says when)."""
    target, source = hunk.target_lines, hunk.source_lines
    lead, trail = hunk.leading_context, hunk.trailing_context
    # As place.py holds it: less context on one side means the hunk sits at that edge of the file.
    first = hunk.target_start <= 1 and lead < trail
    last = trail < lead
    if _occurs(lines, target, first=first, last=last):
        return True
    core = target[lead:len(target) - trail]
    if not core or _occurs(lines, source, first=first, last=last):
        return False
    return (_occurs(lines, target[:len(target) - trail], first=first, last=False)
            or _occurs(lines, target[lead:], first=False, last=last))


def _occurs(lines: Sequence[bytes], run: tuple[bytes, ...], *, first: bool, last: bool) -> bool:
    n = len(run)
    if first and last:
        return tuple(lines) == run
    if first:
        return tuple(lines[:n]) == run
    if last:
        return n <= len(lines) and tuple(lines[len(lines) - n:]) == run
    if not run:
        return True
    head = run[0]
    return any(line == head and tuple(lines[i:i + n]) == run for i, line in enumerate(lines))
