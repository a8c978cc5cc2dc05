"""A series planned on a target, every member held to its review: each member's variant for the
installed release, its diff placed on the result of the members before it (patching/series_plan.py),
and each of its files' reviewed pre- and post-image checked on what it saw and what it left.
Nothing here writes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import HashMismatch, InvalidSeries
from ..patching.diff import Diff, FileAction, FilePatch
from ..patching.series_plan import MemberPlan, SeriesPlan, plan_series
from ..patchset import FileHashes, PatchSet, Variant
from ..series import Series, name_of
from ..targets.base import Distribution
from .diff_checks import load_diff


@dataclass(frozen=True, kw_only=True)
class Member:
    patchset: PatchSet
    variant: Variant
    diff: Diff

    @property
    def reviewed(self) -> bool:
        """Whether the member names its releases and reviewed hashes (a bare diff does not)."""
        return not self.patchset.is_bare

    @property
    def name(self) -> str:
        return name_of(self.patchset)


def members(series: Series, dist: Distribution, strip: int | None = None) -> tuple[Member, ...]:
    """Each member's variant for the installed release and its diff (UnsupportedRelease for a
    member without one), in series order."""
    out = []
    for patchset in series:
        variant = patchset.variant_for(dist.version) if not patchset.is_bare else patchset.variants[0]
        out.append(Member(patchset=patchset, variant=variant,
                          diff=load_diff(patchset, variant, dist, strip, reviewed=not patchset.is_bare)))
    return tuple(out)


def check_shared_files(series: Series, chosen: tuple[Member, ...]) -> None:
    """Two reviewed members that change one file must say which comes first (`requires`): the
    later one's reviewed pre-image of that file is then the earlier one's result. Without it,
    one of them was reviewed against a file the series never has."""
    for later_at, later in enumerate(chosen):
        if not later.reviewed:
            continue
        required = {p.id for p in series.before(later.patchset)}
        for earlier in chosen[:later_at]:
            if not earlier.reviewed or earlier.patchset.id in required:
                continue
            shared = sorted({f.path for f in earlier.diff.files} & {f.path for f in later.diff.files})
            if shared:
                raise InvalidSeries(
                    f"{later.name} and {earlier.name} both change {shared[0]}, but {later.name} does not require {earlier.name}",
                    hint=f"add requires = [\"{earlier.name}\"] to {later.name}'s patch.toml and review its pre-images "
                         f"on {earlier.name}'s result, or drop one of them from the series")


def plan_checked(series: Series, chosen: tuple[Member, ...], read: Callable[[str], bytes | None], *,
                 hash_checks: bool = True) -> SeriesPlan:
    """The series' plan on the files `read` returns, each reviewed member's hashes checked
    (`hash_checks` False: --allow-unknown-base, placement alone decides)."""
    check_shared_files(series, chosen)
    plan = plan_series([(m.name, m.diff) for m in chosen], read)
    if hash_checks:
        for member, placed in zip(chosen, plan.members, strict=True):
            if member.reviewed:
                check_member_hashes(member, placed)
    return plan


def check_member_hashes(member: Member, placed: MemberPlan) -> None:
    """What the member saw must be its reviewed pre-image and what it left its post-image."""
    for file in placed.plan.files:
        expected = member.variant.files[file.path]
        for side, found, wanted in (("pre", file.pre_sha256, expected.pre_sha256),
                                    ("post", file.post_sha256, expected.post_sha256)):
            if found != wanted:
                where = "before it" if side == "pre" else "after it"
                raise HashMismatch(
                    f"patch set {member.name}: {file.path} {where} has sha256 {found or '(none)'}, "
                    f"not its reviewed {side}-image {wanted or '(none)'} ({member.variant.name})",
                    hint="the tree, or a patch set before it in the series, differs from what it was reviewed on; "
                         "nothing was written")


@dataclass(frozen=True, kw_only=True)
class Folded:
    """A series of several patch sets seen as the one change it makes to the tree, which is what
    the single-set steps check: the integrity of every other file, the labels, the probe.

    Its variant's hashes run from the first member that changes a file (its reviewed pre-image)
    to the last (its reviewed post-image); plan_checked has held every member in between to its
    own. Its diff names each file the series changes, with the series' action on it (the hunks
    are the members', placed by the series' planner; this diff is never placed itself)."""

    patchset: PatchSet
    variant: Variant
    diff: Diff
    series: Series
    members: tuple[Member, ...]

    @property
    def id(self) -> str:
        return self.patchset.id or ""


SERIES_JOIN = "+"


def fold(series: Series, chosen: tuple[Member, ...], dist: Distribution) -> Folded:
    """The series as one patch set for `dist`'s release (prepare has refused a bare diff among
    several: it names no hashes to chain). At most one member may bring a probe."""
    distributions = {m.patchset.distribution for m in chosen}
    if len(distributions) > 1:
        raise InvalidSeries(f"the series patches {' and '.join(sorted(distributions))}; one run patches one distribution",
                            hint="split the series by distribution")
    probing = [m for m in chosen if m.patchset.probe is not None]
    if len(probing) > 1:
        raise InvalidSeries(f"{probing[0].name} and {probing[1].name} both bring a probe; a series runs at most one",
                            hint="apply the sets with probes in separate runs, or drop one probe")
    files: dict[str, FileHashes] = {}
    actions: dict[str, FileAction] = {}
    for member in chosen:
        for fp in member.diff.files:
            hashes = member.variant.files[fp.path]
            first = files.get(fp.path)
            files[fp.path] = FileHashes(pre_sha256=first.pre_sha256 if first else hashes.pre_sha256,
                                        post_sha256=hashes.post_sha256)
            pre_absent = files[fp.path].pre_sha256 is None
            actions[fp.path] = "add" if pre_absent else "delete" if hashes.post_sha256 is None else "modify"
    raw = b"".join(m.variant.diff for m in chosen)
    lead = probing[0] if probing else chosen[0]
    variant = Variant(
        name=SERIES_JOIN.join(m.variant.name for m in chosen), releases=(dist.version,),
        diff_path=lead.variant.diff_path, diff=raw, files=files,
        review="unreviewed" if any(m.variant.review == "unreviewed" for m in chosen) else "reviewed")
    patchset = PatchSet(
        id=SERIES_JOIN.join(m.name for m in chosen), title=" + ".join(m.patchset.title for m in chosen),
        summary="a series: " + ", ".join(m.name for m in chosen), distribution=lead.patchset.distribution,
        strip=lead.patchset.strip, probe=lead.patchset.probe, probe_modules=lead.patchset.probe_modules,
        probe_beside=lead.patchset.probe_beside, source=lead.patchset.source, variants=(variant,))
    diff = Diff(files=tuple(FilePatch(path=path, action=actions[path], hunks=()) for path in files),
                sha256=hashlib.sha256(raw).hexdigest())
    return Folded(patchset=patchset, variant=variant, diff=diff, series=series, members=chosen)


def admitted(patchset: PatchSet, variant: Variant, folded: Folded | None) -> list[tuple[PatchSet, Variant]]:
    """Each patch set a run uses, with its variant: a series' members one by one."""
    if folded is None:
        return [(patchset, variant)]
    return [(m.patchset, m.variant) for m in folded.members]
