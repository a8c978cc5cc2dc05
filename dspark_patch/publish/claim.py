"""What an in-image run's audit report claims, read strictly: the first proof `publish` makes.

`apply --root SITE --layer-out FILE` run inside the serving image writes an audit report; `publish`
takes it as hostile input like the layer beside it. Here it must be a whole, successful run of a
reviewed patch set (or series) on a local tree, with a layer written: its command, status and
exit code, the site folder, release and interpreter, the layer's digest and size, and each file's
pre- and post-image hash exactly the reviewed ones of the patch sets it names for its release
(for a series: the first member's pre-image and the last member's post-image of each file). What
the report says of the tree is then proven against the image itself (publish/proofs.py).

What publish cannot prove it does not take from the report (`as_publisher_knows`, before any
registry is asked): each patch set's review state is the one in the patch sets this publisher
loads (an unreviewed one needs --allow-unreviewed, as apply does), and the probe, which only the
in-image job ran, is carried as that job's claim (`probe.claimed_by`), never as a fact the signer
saw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ..errors import DsparkPatchError, PublishRefused, UnreviewedVariant
from ..patchset import PatchSet, Variant, available, known
from ..report.model import AuditReport


@dataclass(frozen=True, kw_only=True)
class Claim:
    """The facts of one in-image run that publish proves and uses."""

    report: AuditReport
    location: str              # the site folder, as the image's interpreter sees it
    release: str               # vLLM's version there
    python: str                # the interpreter that ran it all (a path in the image)
    python_minor: str          # "3.11"
    diff_id: str               # the layer tar's sha256 ("sha256:<hex>")
    size: int                  # and its size in bytes
    members: tuple[tuple[PatchSet, Variant], ...]    # the patch sets applied, in order
    files: dict[str, tuple[str | None, str | None]]  # path -> (pre, post) hash, as reviewed


def refuse(why: str, hint: str = "publish the layer and report one in-image run wrote together, unchanged") -> PublishRefused:
    return PublishRefused(why, hint=hint)


def read_claim(report: AuditReport, where: str) -> Claim:
    """The report's claim, or one PublishRefused line naming what is wrong with it."""
    if report.command != "apply" or report.status != "applied" or report.exit_code != 0 or report.errors:
        raise refuse(f"{where} is the report of a{'n' if report.command == 'apply' else ''} {report.command} that "
                     f"ended {report.status!r}, not of an apply that applied the patch",
                     hint="publish the report of an `apply --root SITE --layer-out FILE` run that ended OK")
    target, layer, patch = report.target, report.layer, report.patch
    if target.kind != "local" or target.distribution is None or not target.python or not target.python_version:
        raise refuse(f"{where} is not the report of an apply to a site folder (`apply --root`) by the image's interpreter",
                     hint="run `python3 -m dspark_patch apply --root SITE --layer-out FILE` inside the serving image")
    if layer is None or layer.diff_id is None or layer.size is None or not layer.ok or layer.unexpected:
        raise refuse(f"{where} records no layer written with --layer-out",
                     hint="run the in-image apply with --layer-out FILE and publish that file")
    if patch is None or not patch.hash_checks or not patch.id or not patch.variant:
        raise refuse(f"{where} is of a bare diff or a run without hash checks; publish takes reviewed patch sets only",
                     hint="apply a patch set by its id (its reviewed hashes) in the in-image run")
    release = target.distribution.version
    by_id = {p.id: p for p in known(available()) if p.id}  # by id only: a report names no folder
    members = tuple(_member(by_id, m.id, release, where) for m in (report.series or (patch,)))
    for (patchset, variant), said in zip(members, report.series or (patch,), strict=True):
        if variant.name != said.variant or variant.diff_sha256 != said.sha256:
            raise refuse(f"{where} names {patchset.id} {said.variant} with diff sha256 {said.sha256[:12]}…, which is "
                         f"not its reviewed {variant.name} ({variant.diff_sha256[:12]}…) for vLLM {release}",
                         hint="publish with the patch sets the in-image run used (the same dspark-patch and DSPARK_PATCH_PATH)")
    files = reviewed_files(members)
    said_files = {f.path: (f.pre_sha256, f.post_sha256) for f in report.files}
    if said_files != files:
        odd = sorted(set(said_files) ^ set(files)) or sorted(p for p in files if said_files[p] != files[p])
        raise refuse(f"{where}: its files and their hashes are not the reviewed ones of "
                     f"{' + '.join(p.id or '' for p, _ in members)} for vLLM {release} (first: {odd[0]})",
                     hint="the report was edited, or made by another patch set; publish the one the run wrote")
    minor = ".".join(target.python_version.split(".")[:2])
    return Claim(report=report, location=target.distribution.location, release=release, python=target.python,
                 python_minor=minor, diff_id=layer.diff_id, size=layer.size, members=members, files=files)


CLAIMED_NOTE = "the probe's result is claimed by the in-image job, not verified by the publisher (it runs nothing)"


def as_publisher_knows(report: AuditReport, where: str, *, allow_unreviewed: bool) -> AuditReport:
    """The report with the publisher's facts in place of the job's word: each member's review
    state from the patch sets loaded here (an unreviewed one refused, UnreviewedVariant exit 2,
    unless `allow_unreviewed`), and a probe that ran marked as the in-image job's claim. A report
    read_claim refuses anyway (not a whole apply of known patch sets) is returned as it is, for
    read_claim to say why."""
    patch, target = report.patch, report.target
    if (report.command != "apply" or report.status != "applied" or patch is None or not patch.id
            or not patch.hash_checks or target.distribution is None):
        return report
    release = target.distribution.version
    by_id = {p.id: p for p in known(available()) if p.id}
    said = report.series or (patch,)
    members = [_member(by_id, m.id, release, where) for m in said]
    unreviewed = [(p, v) for p, v in members if v.review == "unreviewed"]
    notes = list(report.notes)
    for patchset, variant in unreviewed:
        if not allow_unreviewed:
            raise UnreviewedVariant(
                f"{where}: patch set {patchset.id} variant {variant.name} is unreviewed (its patch.toml, as this "
                "publisher loads it; not the report's word); refusing to publish it",
                hint="have a person read its review file and set review = \"reviewed\" in patch.toml, "
                "or pass --allow-unreviewed (the published report says so)")
        notes.append(f"--allow-unreviewed: variant {variant.name} has not been reviewed by a person")
    # members are the series' own, one each (or the one patch set of a report with no series)
    series = tuple(replace(m, review=v.review) for m, (_, v) in zip(report.series, members, strict=False))
    probe = replace(report.probe, claimed_by="in-image job" if report.probe.ran else "")
    if probe.ran:
        notes.append(CLAIMED_NOTE)
    return replace(report, patch=replace(patch, review="unreviewed" if unreviewed else "reviewed"), series=series,
                   probe=probe, notes=tuple(dict.fromkeys(notes)))


def _member(by_id: dict[str, PatchSet], patch_id: str | None, release: str, where: str) -> tuple[PatchSet, Variant]:
    patchset = by_id.get(patch_id or "")
    if patchset is None:
        raise refuse(f"{where} names patch set {patch_id!r}, which this dspark-patch does not know (known: "
                     f"{', '.join(sorted(by_id)) or 'none'})",
                     hint="publish with the patch sets the in-image run used (the same dspark-patch and DSPARK_PATCH_PATH)")
    try:
        return patchset, patchset.variant_for(release)
    except DsparkPatchError as exc:
        raise refuse(f"{where} names patch set {patch_id!r} for vLLM {release}: {exc.message}",
                     hint="publish with the patch sets the in-image run used (the same dspark-patch and DSPARK_PATCH_PATH)") from None


def reviewed_files(members: Sequence[tuple[PatchSet, Variant]]) -> dict[str, tuple[str | None, str | None]]:
    """Per file the series changes: the first member's pre-image and the last member's post-image."""
    files: dict[str, tuple[str | None, str | None]] = {}
    for _, variant in members:
        for path, hashes in variant.files.items():
            pre = files[path][0] if path in files else hashes.pre_sha256
            files[path] = (pre, hashes.post_sha256)
    return files
