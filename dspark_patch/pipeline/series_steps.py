"""A series planned on a target, every member held to its review: each member's variant for the
installed release, its diff placed on the result of the members before it (patching/series_plan.py),
and each of its files' reviewed pre- and post-image checked on what it saw and what it left.
Nothing here writes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import HashMismatch, InvalidSeries
from ..patching.diff import Diff
from ..patching.series_plan import MemberPlan, SeriesPlan, plan_series
from ..patchset import PatchSet, Variant
from ..series import Series, name_of
from ..targets.base import Distribution
from .shared_steps import load_diff


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
