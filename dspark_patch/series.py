"""A series: the patch sets one run applies, in order, as quilt's `series` file lists patches.

A series is named by `--patch` given several times, or by `--series FILE`: one patch set per
line (an id, a folder or a diff file), `#` starting a comment, blank lines skipped; a relative
folder or diff is found beside the series file, as quilt finds patches beside its series.
The order is checked once, before any target is opened: every set a member `requires` is in
the series and comes before it; nothing is listed twice; no two sets require each other.
Whether two sets change the same file is known only once a release's variants are chosen
(patching/series_plan.py checks it there).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from . import ownfiles
from .errors import DsparkPatchError, HunkDoesNotApply, InvalidSeries, UnsupportedRelease
from .patching.diff import Diff, parse_diff
from .patching.plan import plan_one_way
from .patchset import FileHashes, PatchSet, Variant, resolve
from .supersession import first_difference

SERIES_LIMIT = 1 << 16   # a series file lists a few patch sets, not megabytes of lines
MAX_SETS = 64


@dataclass(frozen=True)
class Series:
    sets: tuple[PatchSet, ...]

    def __iter__(self) -> Iterator[PatchSet]:
        return iter(self.sets)

    def __len__(self) -> int:
        return len(self.sets)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name_of(p) for p in self.sets)

    def before(self, patchset: PatchSet) -> tuple[PatchSet, ...]:
        """The members that come before `patchset` and that it requires, directly or through
        another member: the sets whose result its reviewed pre-images describe."""
        # a required set already upstream is not a member, and not followed
        wanted = required_ids(patchset, {p.id: p for p in self.sets if p.id is not None})
        return tuple(p for p in self.sets if p.id in wanted)


def required_ids(patchset: PatchSet, by_id: Mapping[str, PatchSet]) -> set[str]:
    """The ids `patchset` requires, directly or through another set, among `by_id`'s sets (an id
    not there is neither counted nor followed)."""
    seen: set[str] = set()
    todo = list(patchset.requires)
    while todo:
        pid = todo.pop()
        if pid not in seen and pid in by_id:
            seen.add(pid)
            todo.extend(by_id[pid].requires)
    return seen


def name_of(patchset: PatchSet) -> str:
    """How a report and an error name a member: its id, or a bare diff's file name."""
    return patchset.id if patchset.id is not None else patchset.source.name


def load(specs: Sequence[str], *, series_file: str | None = None, strip: int | None = None) -> Series:
    """The series a command line names: `--patch` values in order, or the lines of `--series`
    (not both); nothing named is the shipped default patch set, a series of one."""
    if specs and series_file is not None:
        raise InvalidSeries("--patch and --series both name patch sets",
                            hint="list every patch set in the series file, or give --patch once per set")
    named: list[str | None]
    if series_file is not None:
        named = list(read_series_file(Path(series_file)))
    else:
        named = list(specs) or [None]
    if len(named) > MAX_SETS:
        raise InvalidSeries(f"the series names {len(named)} patch sets; at most {MAX_SETS} are supported",
                            hint="check that this is the series you meant")
    series = Series(tuple(resolve(spec, strip=strip) for spec in named))
    check_order(series)
    return series


def read_series_file(path: Path) -> list[str]:
    """A series file's patch sets, in order: ids as they are, folders and diffs beside the file."""
    raw = ownfiles.read_regular(path, limit=SERIES_LIMIT, what="series file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidSeries(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})",
                            hint="save the series file as UTF-8") from None
    specs: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        if len(entry.split()) > 1:
            raise InvalidSeries(f"{path} line {number}: {entry[:80]!r} names more than one patch set",
                                hint="one patch set (an id, a folder or a diff file) per line")
        beside = path.parent / entry
        specs.append(str(beside) if not os.path.isabs(entry) and os.path.lexists(beside) else entry)
    if not specs:
        raise InvalidSeries(f"{path} names no patch set", hint="list one patch set per line; '#' starts a comment")
    return specs


def check_order(series: Series) -> None:
    """Each member once; every set a member requires is in the series, before it; no cycle."""
    seen: dict[str, int] = {}
    for position, patchset in enumerate(series.sets):
        key = name_of(patchset) if patchset.id is not None else str(patchset.source.resolve())
        if key in seen:
            raise InvalidSeries(f"the series lists {name_of(patchset)} twice (positions {seen[key] + 1} and {position + 1})",
                                hint="list each patch set once")
        seen[key] = position
    ids = {p.id: p for p in series.sets if p.id is not None}
    cycle = _cycle(ids)
    if cycle:
        raise InvalidSeries(f"patch sets {' -> '.join(cycle)} require each other in a cycle",
                              hint="a patch set may require only sets that come before it; remove one of the requires")
    for position, patchset in enumerate(series.sets):
        for required in patchset.requires:
            if required not in ids:
                raise InvalidSeries(f"{name_of(patchset)} requires {required}, which is not in the series",
                                    hint=f"add {required} before {name_of(patchset)} (dspark-patch list shows the known sets)")
            if seen[required] > position:
                raise InvalidSeries(f"{name_of(patchset)} requires {required}, which comes after it in the series",
                                    hint=f"move {required} before {name_of(patchset)}")


def _cycle(ids: dict[str, PatchSet]) -> list[str] | None:
    """A cycle of `requires` among the members, as the ids along it (first repeated last), or None."""
    state: dict[str, str] = {}

    def walk(pid: str, path: list[str]) -> list[str] | None:
        state[pid] = "open"
        for required in ids[pid].requires:
            if required not in ids:
                continue
            if state.get(required) == "open":
                return [*path[path.index(required):], required]
            if required not in state:
                found = walk(required, [*path, required])
                if found:
                    return found
        state[pid] = "done"
        return None

    for pid in ids:
        if pid not in state:
            found = walk(pid, [pid])
            if found:
                return found
    return None


# A patch set's state in a tree, as status reports it (report/status_model.py PatchSetState).
State = Literal["applied", "absent", "partial", "drifted", "not-applicable", "upstream", "superseded"]


def state_of(patchset: PatchSet, hashes: Mapping[str, str], release: str, others: Sequence[PatchSet] = (),
             read: Callable[[str], bytes | None] | None = None) -> State:
    """A patch set's state in a tree (`hashes`: sha256 of its files by path, `release`: its
    version): every file the reviewed post-image -> applied, every file the pre-image -> absent,
    some of each -> partial, any file neither -> drifted; no variant for the release ->
    not-applicable, or `upstream` when the tree already has its newest variant's change (`read`:
    the tree's files, by path; see `upstream`), or `superseded` when a `[[superseded]]` record
    names the release and every file it names is the one its effect cases were proven on. `others`: the other known patch sets. In a series a file may be changed again by a later
    set that requires this one (this one is then applied under it: the file is that set's
    reviewed post-image), and a file this one changes may have been changed first by a set it
    requires (this one is then absent while the file is that set's reviewed pre-image)."""
    try:
        variant = patchset.variant_for(release)
    except UnsupportedRelease:
        record = patchset.superseded_for(release)
        if record is not None:   # its files as proven (apply/verify/probe run the effect cases)
            return "superseded" if first_difference(record, hashes.get) is None else "not-applicable"
        return "upstream" if read is not None and upstream(patchset, read, release) is not None else "not-applicable"
    applied_as, absent_as = _in_series(patchset, others, release)
    pre = post = neither = 0
    for path, expected in variant.files.items():
        actual = hashes.get(path)
        if actual == expected.post_sha256 or actual in applied_as.get(path, ()):
            post += 1
        elif actual == expected.pre_sha256 or actual in absent_as.get(path, ()):
            pre += 1
        else:
            neither += 1
    if neither:
        return "drifted"
    if pre and post:
        return "partial"
    return "applied" if post else "absent"


def _in_series(patchset: PatchSet, others: Sequence[PatchSet],
               release: str) -> tuple[dict[str, set[str | None]], dict[str, set[str | None]]]:
    """Per file of `patchset`: the reviewed post-images of the sets that require it (directly or
    through another) and change the file too; the reviewed pre-images of the sets it requires
    that change the file."""
    by_id = {p.id: p for p in others if p.id is not None}
    if patchset.id is not None:
        by_id[patchset.id] = patchset

    def required(p: PatchSet) -> set[str]:
        return required_ids(p, by_id)

    def files(p: PatchSet) -> dict[str, FileHashes]:
        try:
            return p.variant_for(release).files
        except UnsupportedRelease:
            return {}

    applied_as: dict[str, set[str | None]] = {}
    absent_as: dict[str, set[str | None]] = {}
    for other in by_id.values():
        if other is patchset:
            continue
        if patchset.id in required(other):
            for path, hashes in files(other).items():
                applied_as.setdefault(path, set()).add(hashes.post_sha256)
        if other.id in required(patchset):
            for path, hashes in files(other).items():
                absent_as.setdefault(path, set()).add(hashes.pre_sha256)
    return applied_as, absent_as


def upstream(patchset: PatchSet, read: Callable[[str], bytes | None], release: str) -> Variant | None:
    """The newest variant of a patch set that names no variant for `release`, when the tree
    already has its change: every hunk found applied at zero fuzz and none still fitting
    unapplied (no removed line left where it was). None otherwise: the set does not fit, or it
    names the release, or it is a bare diff."""
    if patchset.is_bare or any(release in v.releases for v in patchset.variants):
        return None
    newest = max(patchset.variants, key=lambda v: max((_release_key(r) for r in v.releases), default=()))
    try:
        diff = parse_diff(newest.diff, strip=patchset.strip)
    except DsparkPatchError:
        return None
    for fp in diff.files:
        one = Diff(files=(fp,), sha256=diff.sha256)
        try:
            plan_one_way(one, read, reverse=True)
        except HunkDoesNotApply:
            return None
        try:
            plan_one_way(one, read)
        except HunkDoesNotApply:
            continue
        return None
    return newest


def _release_key(release: str) -> tuple[int | str, ...]:
    return tuple(int(part) if part.isdigit() else part for part in release.replace("-", ".").split("."))
