"""apply's steps after the plan, as one list over one context (context.py).

Each step says whether it runs, and why not (`RunLog.skipped`): a run that writes nothing
(already applied, a dry run) lists the UNWRITTEN steps as skipped with that reason and runs
none; a run that writes runs the list in order. Every outcome then ends in `close` (the layer
check joined, the result committed, named or settled). Once the write has happened, a failure
of any later step puts the tree back. Adding a step is one entry in STEPS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..report.model import AuditReport
from . import local_steps
from .context import UNWRITTEN, ApplyContext, Outcome
from .image_steps import commit_image, name_source, take_layer
from .shared_steps import bytecode_paths, bytecode_restore_plan, check_written, compile_files, probe_step


def _runs(ctx: ApplyContext) -> str | None:
    return None


def _takes_layer(ctx: ApplyContext) -> bool:
    """An image (its result is the source plus this layer), or a local tree with --layer-out."""
    return ctx.image is not None or ctx.layer_out is not None


def _always(ctx: ApplyContext) -> bool:
    return True


@dataclass(frozen=True, kw_only=True)
class Step:
    name: str
    run: Callable[[ApplyContext], None]
    skip: Callable[[ApplyContext], str | None] = _runs   # why it does not run (recorded), or None
    applies: Callable[[ApplyContext], bool] = _always    # False: not a step of this kind of target at all
    writes: bool = False                                 # once it ran, a failure puts the tree back


def _write(ctx: ApplyContext) -> None:
    with ctx.run.step("write"):
        if ctx.local is not None:  # the journal first: what a later run needs if this one is killed
            ctx.local.target.write_journaled(ctx.planned, list(ctx.pyc_before or ()))
        else:
            ctx.target.write(ctx.planned)


def _reread(ctx: ApplyContext) -> None:
    with ctx.run.step("re-read"):
        check_written(ctx.target, ctx.planned)


def _compile(ctx: ApplyContext) -> None:
    with ctx.run.step("compile"):
        compile_files(ctx.target, ctx.dist, ctx.planned, ctx.run)


def _take_layer(ctx: ApplyContext) -> None:
    # Taken before the probe runs: nothing the probe does can reach the layer.
    taker = ctx.image.target if ctx.image is not None else ctx.layer_out
    assert taker is not None
    take_layer(taker, ctx.dist, ctx.planned, ctx.pyc_before or {}, ctx.run)


def _probe(ctx: ApplyContext) -> None:
    assert ctx.patchset.probe is not None
    probe_step(ctx.target, ctx.dist, ctx.patchset.probe, ctx.run, ctx.patchset.probe_modules, early=ctx.early)


STEPS = (
    Step(name="write", run=_write, writes=True),
    Step(name="re-read", run=_reread),
    Step(name="compile", run=_compile, skip=lambda ctx: None if ctx.request.compile else "--no-compile"),
    Step(name="layer", run=_take_layer, applies=_takes_layer),
    Step(name="probe", run=_probe, skip=lambda ctx: ctx.probe_skipped),
)

_UNWRITTEN_WHY: dict[Outcome, str] = {"already-applied": "already applied", "dry-run": "dry run"}


def run_steps(ctx: ApplyContext, outcome: Outcome) -> AuditReport:
    """The steps for `outcome` (decided by the caller), then `close`; the report of that outcome."""
    run = ctx.run
    if outcome != "applied":
        if outcome == "already-applied":
            ctx.early.cancel()
            run.notes.append("every hunk is already in place; nothing was written")
        for name in UNWRITTEN:
            run.skipped(name, _UNWRITTEN_WHY[outcome])
        close(ctx, outcome)
        return run.report(outcome)
    ctx = replace(ctx, pyc_before={pyc: ctx.reader(pyc) for pyc in bytecode_paths(ctx.planned, ctx.dist)})
    written = False
    try:
        for step in STEPS:
            if not step.applies(ctx):
                continue
            why = step.skip(ctx)
            if why is not None:
                run.skipped(step.name, why)
                continue
            step.run(ctx)
            written = written or step.writes
        close(ctx, outcome)
    except BaseException:
        if written:
            _restore(ctx)
        raise
    return run.report(outcome)


def close(ctx: ApplyContext, outcome: Outcome) -> None:
    """Every outcome's end: the layer check joined; then an image's result committed (applied)
    or its source named (already applied, not a dry run), a local tree's run settled (applied)."""
    run, image, layers = ctx.run, ctx.image, ctx.layers
    if layers is not None:  # an image's: exactly when there is an image flow
        layers.join(run)
    if outcome == "applied" and image is not None and layers is not None:
        commit_image(image.spec, image.target, ctx.planned, ctx.patchset, ctx.variant, run, dist=ctx.dist,
                     on_result=ctx.on_result)
        layers.cache_new_layer()
    elif outcome == "applied" and ctx.local is not None:
        # the report set first, then the run is whole (inside the steps: a failure rolls back)
        record = local_steps.probe_record(ctx.patchset, ctx.dist, ctx.planned, hash_checks=ctx.policy.hash_checks)
        written: list[str] = []   # the layer file, once this run has put it in place
        try:
            if ctx.layer_out is not None:
                local_steps.write_layer(ctx, ctx.layer_out, written)
            local_steps.settle(run, ctx.local, record, "applied", ctx.on_result)
        except BaseException:
            local_steps.drop_layer(written)   # the tree is put back: no layer of a run that did not end whole
            raise
    elif outcome == "already-applied" and image is not None and image.spec.tag and not ctx.request.dry_run:
        name_source(image.spec, image.target, run, ctx.on_result)


def _restore(ctx: ApplyContext) -> None:
    with ctx.run.step("restore", unwinding=True):
        if ctx.local is not None:
            ctx.local.target.roll_back()
        else:
            ctx.target.restore(bytecode_restore_plan(ctx.target, ctx.pyc_before or {}, ctx.planned))
            ctx.target.restore(ctx.planned)
