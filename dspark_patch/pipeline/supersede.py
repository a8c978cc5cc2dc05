"""A patch set the installed release ships in its own form (patch.toml `[[superseded]]`): proven
on the pristine release, never taken from the version number. The release's files named by the
record must be the bytes the record was made on, and the patch set's probe must pass the record's
effect cases there. Then apply and verify carry nothing for that set and say why."""

from __future__ import annotations

import hashlib

from ..errors import SupersededUnproven, UnreviewedVariant
from ..patchset import PatchSet
from ..probe.prestart import EarlyProbe
from ..probe.run import run_probe
from ..report.model import AuditReport, SupersededReport
from ..supersession import Superseded, first_difference
from ..targets.base import Distribution, Target
from .runlog import RunLog


def prove(patchset: PatchSet, record: Superseded, target: Target, dist: Distribution, run: RunLog, *,
          probe: bool, allow_unreviewed: bool, early: EarlyProbe | None = None) -> SupersededReport:
    """Prove `record` on the target's pristine release, or raise: its files, then its effect cases
    (the run's `probe`). `probe`: False for --no-probe, which cannot prove it."""
    name = f"{patchset.id} ({record.name})"
    if record.review != "reviewed" and not allow_unreviewed:
        raise UnreviewedVariant(f"the superseded record {name} is unreviewed: made by `dspark-patch port`, "
                                "not yet marked reviewed",
                                hint=f"read {record.review_file or 'its review file'} and set review = \"reviewed\"; "
                                     "or pass --allow-unreviewed")
    if not probe or patchset.probe is None:
        raise SupersededUnproven(f"{name}: {dist.name} {dist.version} ships the change only if its effect cases "
                                 "pass there, and --no-probe runs none",
                                 hint="run without --no-probe")
    # The behaviour first, also where the files differ: the report then says what the tree does.
    with run.step("probe"):
        probed = run_probe(target, dist, patchset.probe, modules=patchset.probe_modules, early=early,
                           only=record.effect_cases)
        run.update(probe=probed)
    if not probed.ok:
        raise SupersededUnproven(f"{name}: the effect cases fail on {dist.name} {dist.version}, so it does not "
                                 f"ship the change: {probed.detail}",
                                 hint="see the probe cases in the report; the patch set has no variant for this release")
    problem = first_difference(record, lambda path: _sha256(target.read(path)))
    if problem is not None:
        raise SupersededUnproven(f"{patchset.id} names {dist.name} {dist.version} as superseded, but {problem}",
                                 hint="the release was changed: reinstall it from its wheel")
    return SupersededReport(id=patchset.id or "", record=record.name, release=dist.version, upstream=record.upstream,
                            where=record.where, review=record.review, effect_cases=record.effect_cases)


def probed(patchset: PatchSet, record: Superseded, target: Target, dist: Distribution, run: RunLog) -> AuditReport:
    """`probe` on a release a record names: its effect cases are the probe (a record made by port
    and not yet reviewed runs too: probing is how a person reviews it)."""
    proven = prove(patchset, record, target, dist, run, probe=True, allow_unreviewed=True)
    run.update(superseded=(proven,))
    run.notes.append(note(proven, dist.name))
    return run.report("probed")


def note(report: SupersededReport, distribution: str) -> str:
    return (f"{report.id} is superseded in {distribution} {report.release}: {report.upstream} "
            f"({report.where[0]}); its {len(report.effect_cases)} effect cases passed on the pristine release "
            f"(record {report.record}, {report.review}); nothing of it is carried")


def _sha256(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()
