"""apply and verify when every patch set named is upstream in the installed release (series.py
`upstream`) or superseded by it (supersede.py, proven before this runs): nothing is carried,
nothing written or named; the tree must still be the published wheel, checked as any base is."""

from __future__ import annotations

from ..errors import VerifyMismatch
from ..patching.diff import Diff
from ..report.model import AuditReport
from ..targets.base import Distribution, ImageCapable, Target
from .context import UNWRITTEN
from .image_steps import refuse_runs_first, refuse_started, refuse_unimported, runs_first, unimported_copies
from .integrity_check import check_base, check_integrity, integrity_problems
from .policy import CheckPolicy
from .requests import ApplyRequest, ImageSpec
from .runlog import RunLog


def nothing_to_carry(request: ApplyRequest, target: Target, run: RunLog, dist: Distribution) -> AuditReport:
    """Every patch set named is upstream in this release (the notes say which): the tree must
    still be the published wheel, and then it carries everything asked; nothing is written or
    named (the source is the result)."""
    if isinstance(target, ImageCapable):   # an image that runs other code is refused as in any apply
        refuse_unimported(target, dist, run)
        refuse_started(refuse_runs_first(target, dist, run), dist.name, run)
    check_base(run, target, dist, Diff(files=(), sha256=""), None,
               CheckPolicy(release_checks=True, allow_unknown_base=request.allow_unknown_base))
    why = _why(run)
    if isinstance(request.target, ImageSpec) and request.target.tag:
        run.notes.append(f"--tag {request.target.tag}: nothing was named, as nothing was carried; the source "
                         f"{request.target.ref} is the result (docker tag it where a pipeline needs that name)")
    for name in UNWRITTEN:
        if not (name == "probe" and run.draft.probe.ran):   # a superseded set's effect cases ran
            run.skipped(name, why)
    return run.report("already-applied")


def _why(run: RunLog) -> str:
    return "superseded" if run.draft.superseded else "upstream"


def verify_upstream(target: Target, run: RunLog, dist: Distribution) -> AuditReport:
    """Every patch set named is upstream in this release: verified when the tree is the published
    wheel (nothing of ours is in it to check)."""
    with run.step("integrity"):
        i = check_integrity(target, dist, Diff(files=(), sha256=""), None)
        run.update(integrity=i)
        problems = [*i.unverified, *integrity_problems(i)]
    if isinstance(target, ImageCapable):   # what runs decides what the rest means, as for any verify
        copy = unimported_copies(target, dist, run)
        problems += [copy] if copy is not None else []
        problems[:0] = runs_first(target, dist, run)
    if not run.draft.probe.ran:
        run.skipped("probe", _why(run))
    if problems:
        raise VerifyMismatch(f"{run.draft.target.ref} does not carry exactly the release: " + "; ".join(problems[:3]),
                             hint="rebuild the image from the release")
    return run.report("verified")
