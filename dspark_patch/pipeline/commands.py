"""apply / verify / probe as steps: plan -> target -> report.

Each command opens its target, runs named, timed steps, and always returns an AuditReport —
a failed run included, with the error that stopped it. Nothing here prints: progress goes to
an optional `on_step` callback that the CLI renders.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, replace

from ..errors import BadInput, CheckFailed, DsparkPatchError, ProbeFailed, VerifyMismatch
from ..patching.plan import PatchPlan, plan_patch
from ..patchset import resolve
from ..report.model import AuditReport, FileReport, ImageRecord
from ..targets.base import ImageCapable, Journaled, PullCallback, Target
from ..targets.caches import seal
from ..targets.layers.scan import LayerScan
from . import local_steps, supersede
from .apply_steps import run_steps
from .context import ApplyContext, ImageFlow, Outcome
from .image_steps import (
    LABEL_PREFIX,
    LayerCheck,
    check_labels,
    note_unread_env,
    refuse_runs_first,
    refuse_started,
    refuse_unimported,
    runs_first,
    unimported_copies,
)
from .integrity_check import check_base, check_integrity, integrity_problems
from .our_layer import OurLayer, UnderOurLayer, check_our_layer, labelled, our_layer, top_layer_scan, verify_top_layer
from .requests import ApplyRequest, ImageSpec, LocalSpec, ProbeRequest, TargetSpec, VerifyRequest
from .resolve import ImageSource, LocalSource, Source
from .runlog import ResultCallback, RunLog, StepCallback, target_report, with_distribution
from .series_steps import Folded, admitted, plan_checked
from .shared_steps import (
    AllUpstream,
    CachingReader,
    EarlyStart,
    check_known_images,
    check_post_images,
    file_reports,
    patch_name,
    plan_or_none,
    prepare,
    probe_step,
    sha256_of,
)
from .upstream_steps import nothing_to_carry, verify_upstream


def apply(request: ApplyRequest, *, source: Source, on_step: StepCallback | None = None,
          on_pull: PullCallback | None = None, on_result: ResultCallback | None = None) -> AuditReport:
    """`on_result`: called with the report before an image result is named (runlog.ResultCallback).
    `source`: what `request.target` names (resolve.py), with the run's one store."""
    run = RunLog.start("apply", target_report(request.target), on_step, route=source.route)
    try:
        return _run(run, source, lambda target: _apply(request, target, run, on_result), on_pull)
    except UnderOurLayer as under:
        assert isinstance(source, ImageSource)
        return _apply_under(request, source, under.layer, run, on_step, on_pull, on_result)


@dataclass(frozen=True, kw_only=True)
class _Under:
    """A run on the image under the source's layer of ours (our_layer.py)."""

    layer: OurLayer
    top: LayerScan | None       # the source's top layer, read with the strict reader
    source: ImageRecord         # the image the user named


def _apply_under(request: ApplyRequest, source: ImageSource, layer: OurLayer, first: RunLog,
                 on_step: StepCallback | None, on_pull: PullCallback | None,
                 on_result: ResultCallback | None) -> AuditReport:
    """apply on the image under the source's layer of ours: that image is loaded (its layers are
    the engine's already), the run starts again on it, and it is removed when the run ends."""
    store = source.store()
    distribution = first.draft.target.distribution.name if first.draft.target.distribution else "vllm"
    try:
        with first.step("layer of ours"):
            info = store.image_info(layer.image_id)
            top = top_layer_scan(store, info.id, info.diff_ids[-1], distribution)
            base, existed = store.image_under_top(info.id, label_prefix=LABEL_PREFIX)
    except DsparkPatchError as exc:
        return first.report("failed", exc)
    run = RunLog.start("apply", target_report(request.target), first.on_step, route=source.route)
    run.notes.append(f"{source.spec.ref} carries a dspark-patch layer of {layer.named}: applied to the image under "
                     f"it ({base[:19]}); that layer is replaced, not stacked")
    under = _Under(layer=layer, top=top, source=ImageRecord(ref=source.spec.ref, id=info.id))
    on_base = replace(source, spec=replace(source.spec, ref=base, pull="never"), note=None)
    try:
        return _run(run, on_base, lambda target: _apply(request, target, run, on_result, under=under), on_pull)
    finally:
        if not existed:
            try:
                store.remove_image(base)
            except DsparkPatchError:
                pass  # a run beside this one works on it too; it is an untagged image


def verify(request: VerifyRequest, *, source: Source, on_step: StepCallback | None = None,
           on_pull: PullCallback | None = None) -> AuditReport:
    run = RunLog.start("verify", target_report(request.target), on_step, route=source.route)
    return _run(run, source, lambda target: _verify(request, target, run), on_pull)


def probe(request: ProbeRequest, *, source: Source, on_step: StepCallback | None = None,
          on_pull: PullCallback | None = None) -> AuditReport:
    run = RunLog.start("probe", target_report(request.target), on_step, route=source.route)

    def steps(target: Target) -> AuditReport:
        with run.step("load patch"):
            patchset = resolve(request.patch)
        with run.step("locate"):
            dist = target.locate(patchset.distribution)
        run.update(target=with_distribution(run.draft.target, dist))
        if patchset.probe is None:
            run.skipped("probe", "this patch set has no probe")
            which = f"patch set {patchset.id}" if patchset.id else f"the bare diff {patchset.source.name}"
            raise BadInput(f"{which} has no probe, so there is nothing to run",
                           hint="choose a patch set whose patch.toml names a probe (dspark-patch show ID)")
        if (record := patchset.superseded_for(dist.version)) is not None:   # its effect cases are the probe
            return supersede.probed(patchset, record, target, dist, run)
        probe_step(target, dist, patchset.probe, run, patchset.probe_modules)
        return run.report("probed")

    return _run(run, source, steps, on_pull)


def withdraw(report: AuditReport) -> str | None:
    """Take back what an image `apply` named or made when its reports could not be written (a failed
    run leaves no tag and no new image): one line saying what was done, or None. A pushed tag stays
    (registries have no conditional delete), and that is said."""
    image = report.result_image
    if report.command != "apply" or image is None or report.status not in ("applied", "already-applied"):
        return None
    from ..targets import open_store

    store = open_store()
    done = []
    if image.ref != image.id and store.tag_exists(image.ref) and store.image_info(image.ref).id == image.id:
        store.remove_image(image.ref)  # `docker rmi TAG`: the name; the image too when nothing else names it
        done.append(f"the tag {image.ref} was removed again")
    if report.status == "applied" and store.tag_exists(image.id):
        store.remove_image(image.id)
        done.append(f"the image {image.id} this run made was removed")
    if image.repo_digest:
        done.append(f"{image.repo_digest} stays in its registry (pushed before the reports failed)")
    return "; ".join(done) or None


def _run(run: RunLog, source: Source, steps: Callable[[Target], AuditReport],
         on_pull: PullCallback | None) -> AuditReport:
    """Open the target, run the steps, close the target (removing any container), report."""
    target: Target | None = None
    noted = set(seal.notes())
    if isinstance(source, ImageSource) and source.note:
        run.notes.append(source.note)
    try:
        with ExitStack() as stack:
            target = _open(source, run, stack, on_pull)
            report = steps(target)
    except DsparkPatchError as exc:
        report = run.report("failed", exc)
    # Notes the target gathered while closing (a kept container, leftovers it removed), and cache
    # entries or a cache key not used (targets/caches/seal.py).
    notes = (*(target.notes if target is not None else ()), *(n for n in seal.notes() if n not in noted))
    return replace(report, notes=report.notes + notes) if notes else report


def _open(source: Source, run: RunLog, stack: ExitStack, on_pull: PullCallback | None) -> Target:
    with run.step("open target"):
        if isinstance(source, LocalSource):
            from ..targets.local_tree import LocalTree

            return LocalTree(source.spec.root, python=source.spec.python)
        # An index is run per platform (index_run.py), each platform an ImageSource.
        assert isinstance(source, ImageSource)
        spec = source.spec
        # --pull happens here (as `docker run` pulls before it creates); progress goes to on_pull.
        # The run's one store: EngineUnreachable, if the engine did not answer, is said here.
        target = stack.enter_context(source.store().open_image(spec.ref, python=spec.python, pull=spec.pull,
                                                               on_pull=on_pull))
        run.update(target=replace(run.draft.target, image=ImageRecord(ref=spec.ref, id=target.info.id or "")))
        return target


def _image_flow(spec: TargetSpec, target: Target) -> ImageFlow | None:
    if not isinstance(spec, ImageSpec):
        return None
    if not isinstance(target, ImageCapable):
        raise TypeError(f"an image request opened a {type(target).__name__}, which cannot commit")
    return ImageFlow(spec=spec, target=target)


def _apply(request: ApplyRequest, target: Target, run: RunLog, on_result: ResultCallback | None,
           under: _Under | None = None) -> AuditReport:
    """apply's context, made once: what is refused before the plan is refused here. `under`: the
    run is on the image under the source's layer of ours (the source is what the report names)."""
    # The image flow, checked once: an image request opens an image target.
    image = _image_flow(request.target, target)
    if under is not None:
        run.update(target=replace(run.draft.target, image=under.source))
    early = EarlyStart(target, wanted=request.probe and not request.dry_run)
    try:
        prepared = prepare(
            run, target, request.patches, request.strip, series_file=request.series, after_load=early,
            allow_unknown_base=request.allow_unknown_base, allow_unreviewed=request.allow_unreviewed,
            probe=request.probe)
    except AllUpstream as upstream:
        early.cancel()
        return nothing_to_carry(request, target, run, upstream.dist)
    if prepared.patchset.probe is None:
        early.cancel()   # the set that brought a probe is upstream: nothing of it runs
    patchset, policy, dist, variant, diff = (prepared.patchset, prepared.policy, prepared.dist, prepared.variant,
                                             prepared.diff)
    for member, its_variant in admitted(prepared.patchset, prepared.variant, prepared.folded):
        note = policy.admit(member, its_variant)
        if note is not None:
            run.notes.append(note)
    if under is not None:
        check_our_layer(under.layer, under.top, dist)
    elif image is not None:
        ours = our_layer(image.target, target.info.id or "", patchset, variant)
        if ours is not None:
            early.cancel()
            raise UnderOurLayer(ours)
    if image is not None and image.spec.tag and not request.dry_run:
        image.target.refuse_existing_tag(image.spec.tag, force=image.spec.force)
    started = None
    if image is not None:
        refuse_unimported(image.target, dist, run)
        started = refuse_runs_first(image.target, dist, run)
    layers = LayerCheck(image.target, patchset.distribution, strict=request.strict_layers, started=started) \
        if image is not None else None
    # A local tree: first finish or undo what an interrupted apply left (its journal).
    local = local_steps.recover(run, target, diff, dry_run=request.dry_run) \
        if isinstance(request.target, LocalSpec) and isinstance(target, Journaled) else None
    ctx = ApplyContext(request=request, target=target, run=run, on_result=on_result, patchset=patchset, policy=policy,
                       dist=dist, variant=variant, diff=diff, reader=CachingReader(target), early=early, image=image,
                       local=local, layers=layers, folded=prepared.folded, layer_out=local_steps.layer_writer(request, target))
    try:
        return _patch(ctx)
    except CheckFailed:
        # What runs first decides what the rest means (as verify says it first): a check that
        # failed on an image that runs other code is refused as that.
        if started is not None and not any(s.name == "runtime" for s in run.steps):
            refuse_started(started, patchset.distribution, run)
        raise
    finally:
        if layers is not None:
            layers.cancel()  # a refusal or failure: no save of the image outlives the run


def _patch(ctx: ApplyContext) -> AuditReport:
    """apply's plan and base check; then the outcome, decided here only, and its steps (apply_steps.py)."""
    run, policy = ctx.run, ctx.policy
    assert run.draft.patch is not None  # set by prepare()
    run.update(patch=replace(run.draft.patch, hash_checks=policy.hash_checks))
    run.notes.extend(policy.notes)
    ctx = replace(ctx, plan=_plan(ctx))
    check_base(run, ctx.target, ctx.dist, ctx.diff, ctx.variant, policy)
    outcome = _outcome(ctx)
    if outcome != "applied" and ctx.layer_out is not None:
        run.notes.append(f"--layer-out: no layer written ({outcome}: this run writes no file)")
    if outcome == "already-applied" and ctx.local is not None:
        return local_steps.already_applied(ctx, ctx.local)
    return run_steps(ctx, outcome)


def _outcome(ctx: ApplyContext) -> Outcome:
    if ctx.planned.status == "already-applied":
        return "already-applied"
    return "dry-run" if ctx.request.dry_run else "applied"


def _plan(ctx: ApplyContext) -> PatchPlan:
    diff, variant, reader, policy = ctx.diff, ctx.variant, ctx.reader, ctx.policy
    if ctx.folded is not None:
        return _plan_series(ctx, ctx.folded)
    with ctx.run.step("plan"):
        reader.prefetch(fp.path for fp in diff.files)
        if policy.hash_checks:  # before placing hunks: "not the reviewed file" is the clearer message
            check_known_images(diff, variant, ctx.dist, reader)
        # Files that are exactly the reviewed post-images are applied, even where a hunk's
        # context would still fit after it was applied.
        reviewed_post = policy.release_checks and all(
            sha256_of(reader(fp.path)) == variant.files[fp.path].post_sha256 for fp in diff.files)
        plan = plan_patch(diff, reader, applied_first=reviewed_post)
        ctx.run.update(files=file_reports(plan, variant))
        if policy.release_checks:
            # Never dropped where the files are the reviewed pre-images (--allow-unknown-base
            # included): the reviewed post-image is then exactly what must come out.
            reviewed_pre = all(fp.pre_sha256 == variant.files[fp.path].pre_sha256 for fp in plan.files)
            check_post_images(plan, variant,
                              enforce=policy.hash_checks or reviewed_pre or plan.status == "already-applied")
    return plan


def _plan_series(ctx: ApplyContext, folded: Folded) -> PatchPlan:
    """A series: each member placed on the result of the ones before it and held to its own
    reviewed hashes (series_steps.py); the folded variant's post-images then hold as for one set."""
    with ctx.run.step("plan"):
        ctx.reader.prefetch(f.path for m in folded.members for f in m.diff.files)
        placed = plan_checked(folded.series, folded.members, ctx.reader, hash_checks=ctx.policy.hash_checks)
        plan = replace(placed.combined, diff_sha256=folded.diff.sha256)
        ctx.run.update(files=file_reports(plan, folded.variant))
        check_post_images(plan, folded.variant, enforce=ctx.policy.hash_checks or plan.status == "already-applied")
        carried = [m.name for m in placed.members if m.applied_before]
        if carried and plan.status == "apply":
            ctx.run.notes.append(f"the tree already carries {', '.join(carried)}: the rest of the series goes on top")
    return plan


def _verify(request: VerifyRequest, target: Target, run: RunLog) -> AuditReport:
    early = EarlyStart(target, wanted=request.probe)  # it overlaps the integrity walk
    patches = request.patches or (labelled(target, run) if request.series is None else ())
    try:
        unread = (lambda dist: note_unread_env(target, dist, run)) if isinstance(target, ImageCapable) else None
        prepared = prepare(run, target, patches, request.strip, series_file=request.series, after_load=early,
                           probe=request.probe, after_locate=unread)
    except AllUpstream as upstream:
        early.cancel()
        return verify_upstream(target, run, upstream.dist)
    patchset, policy, dist, variant, diff = (prepared.patchset, prepared.policy, prepared.dist, prepared.variant,
                                             prepared.diff)
    for member, its_variant in admitted(prepared.patchset, prepared.variant, prepared.folded):
        if policy.unreviewed(its_variant):
            of = "" if prepared.folded is None else f" of {member.id}"
            run.notes.append(f"variant {its_variant.name}{of} is unreviewed: made by `dspark-patch port`, "
                             "not yet marked reviewed")
    reader = CachingReader(target)
    problems: list[str] = []

    with run.step("patched files"):
        for fp in diff.files:
            expected = variant.files.get(fp.path)
            found = FileReport(path=fp.path, action=fp.action, pre_sha256=None, post_sha256=sha256_of(reader(fp.path)),
                               expected_pre_sha256=expected.pre_sha256 if expected else None,
                               expected_post_sha256=expected.post_sha256 if expected else None)
            run.update(files=(*run.draft.files, found))
        if not policy.release_checks:
            plan = plan_or_none(diff, reader)
            if plan is None or plan.status != "already-applied":
                problems.append("the diff is not applied to this tree")
        else:
            for fr in run.draft.files:
                if fr.post_sha256 == fr.expected_post_sha256:
                    continue
                state = "unpatched (it is the pre-image)" if fr.post_sha256 == fr.expected_pre_sha256 and fr.post_sha256 else (
                    "missing" if fr.post_sha256 is None else "changed (neither pre- nor post-image)")
                problems.append(f"{fr.path} is {state}")

    with run.step("integrity"):
        i = check_integrity(target, dist, diff, policy.checked_variant(variant))
        run.update(integrity=i)
        run.notes.extend(i.notes)
        if not policy.release_checks and i.reference is None:
            run.notes.extend(i.unverified)  # a bare diff checks no release; there is nothing to check against
        else:
            problems += list(i.unverified)
        problems += integrity_problems(i)

    if isinstance(target, ImageCapable):
        copy = unimported_copies(target, dist, run)
        if copy is not None:
            problems.append(copy)
        problems[:0] = runs_first(target, dist, run)  # first: what runs decides what the rest means
        with run.step("labels"):
            labels = check_labels(target, variant, patchset, policy, run.draft.series)
        with run.step("layer"):  # a layer of ours, by its labels: only what apply writes, as apply writes it
            files = {fp.path: None if fp.action == "delete" else fp.path for fp in diff.files}
            problems += labels or verify_top_layer(target, dist, files, patch_name(patchset, variant), run)

    if request.probe and patchset.probe is not None:
        try:
            probe_step(target, dist, patchset.probe, run, patchset.probe_modules, early=early)
        except ProbeFailed as exc:
            problems.append(exc.message)
    else:
        run.skipped("probe", "--no-probe" if not request.probe else "this patch set has no probe")

    pending = target.pending() if isinstance(target, Journaled) else None
    if pending is not None:  # first: whatever else holds, the tree is in the middle of an apply
        problems.insert(0, f"an apply of this tree was interrupted and is not finished (its journal {pending} is "
                           "there; apply finishes or undoes it)")

    if problems:
        more = f" (and {len(problems) - 3} more; see the report)" if len(problems) > 3 else ""
        raise VerifyMismatch(
            f"{run.draft.target.ref} does not carry exactly {patch_name(patchset, variant)}: " + "; ".join(problems[:3]) + more,
            hint="apply the patch to a pristine release, or rebuild the image",
        )
    return run.report("verified")
