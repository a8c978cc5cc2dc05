"""apply's steps for a target with a journal (a local tree, `--root`): finish what a killed run
left, and call a tree "already applied" only once a probe has passed on exactly its files.

- **recover**, before the plan: a journal an interrupted apply left is rolled back, or, when its
  post-images are all in place for this very diff, kept, so that this run compiles and probes
  them (targets/recovery.py). A dry run writes nothing, so it refuses a tree with a journal.
- **already applied**: OK at once only when the tree keeps the record of a passing probe on these
  post-images with this probe and interpreter (targets/probe_record.py) and no journal is being
  finished; otherwise the files are compiled and probed first, and the report says so. A failure
  there rolls back what the journal holds (a continued run), or puts the bytecode back (a tree
  that was already applied before this run: its sources are left as they were).
- **settle**, the run's end: the report set is written (the CLI's `on_result`, as before an
  image's result is named), then the record of a passing probe, then the journal is removed: the
  run is whole. A failure there rolls back as a failed probe does.
"""

from __future__ import annotations

import contextlib
import hashlib
import os

from ..errors import BadInput, UnfinishedApply
from ..patching.diff import Diff
from ..patching.plan import PatchPlan
from ..patchset import PatchSet
from ..probe.run import bundle
from ..report.model import AuditReport, Status
from ..targets.base import Distribution, Journaled, Target
from ..targets.probe_record import ProbeRecord
from ..targets.recovery import Recovery
from .context import UNWRITTEN, ApplyContext, LocalFlow
from .image_steps import LayerWriter
from .requests import ApplyRequest, ImageSpec
from .runlog import ResultCallback, RunLog
from .shared_steps import CachingReader, bytecode_paths, bytecode_restore_plan, compile_files, probe_step


def recover(run: RunLog, target: Journaled, diff: Diff, *, dry_run: bool) -> LocalFlow:
    pending = target.pending()
    if dry_run:
        if pending is not None:
            raise UnfinishedApply(f"an earlier apply of this tree was interrupted; its journal {pending} is still there",
                                  hint="run apply without --dry-run: it finishes or undoes that first, and says which")
        return LocalFlow(target=target, recovery=None)
    paths = frozenset(fp.path for fp in diff.files)
    if pending is None:  # at most the leftovers of a run killed before its journal was in place
        recovery = target.recover(diff.sha256, paths)
    else:
        with run.step("recover"):
            recovery = target.recover(diff.sha256, paths)
    if recovery is not None:
        run.notes.append(_note(recovery))
    return LocalFlow(target=target, recovery=recovery)


def _note(r: Recovery) -> str:
    temps = f"; removed {r.temps} temporary file{'s' if r.temps != 1 else ''} it left" if r.temps else ""
    if r.outcome == "continued":
        return (f"an earlier apply of this tree was interrupted after it had written every file ({r.files}), before "
                f"it was whole (journal {r.journal}){temps}: this run compiles and probes them")
    if r.files == 0 and r.bytecode == 0:
        return f"an earlier apply of this tree was interrupted before it had replaced any file{temps}"
    bytecode = f" and {r.bytecode} bytecode file{'s' if r.bytecode != 1 else ''}" if r.bytecode else ""
    return (f"an earlier apply of this tree was interrupted half-way (journal {r.journal}): rolled back {r.files} "
            f"file{'s' if r.files != 1 else ''}{bytecode} to the pre-image{temps}; then this run applied the patch")


def probe_record(patchset: PatchSet, dist: Distribution, plan: PatchPlan, *, hash_checks: bool) -> ProbeRecord | None:
    """What a passing probe on `plan`'s post-images with this interpreter is recorded as; None when
    no record can vouch for it (no probe; no hash checks, so the rest of the tree is unchecked)."""
    if patchset.probe is None or not hash_checks:
        return None
    source = bundle(patchset.probe, patchset.probe_modules)
    return ProbeRecord(
        distribution=dist.name, version=dist.version, diff_sha256=plan.diff_sha256,
        files=tuple((f.path, f.post_sha256) for f in plan.files),
        probe_sha256=hashlib.sha256(source.encode("utf-8", "surrogateescape")).hexdigest(),
        python=dist.python, python_version=dist.python_version, cache_tag=dist.cache_tag,
    )


def settle(run: RunLog, local: LocalFlow, record: ProbeRecord | None, status: Status,
           on_result: ResultCallback | None) -> None:
    """The run's end: its report set first (`on_result`: the CLI writes it), then the record of the
    probe if it ran and passed, then the journal removed. Called inside the run's roll-back: a run
    whose reports cannot be written is not whole, and leaves the tree as it found it."""
    if on_result is not None:
        on_result(run.report(status))
    local.target.settle(record if run.draft.probe.ran and run.draft.probe.ok else None)


def already_applied(ctx: ApplyContext, local: LocalFlow) -> AuditReport:
    """A tree whose every hunk is in place: OK as it is only when a passing probe is on record."""
    request, target, run, early, patchset, dist = ctx.request, ctx.target, ctx.run, ctx.early, ctx.patchset, ctx.dist
    plan = ctx.planned
    record = probe_record(patchset, dist, plan, hash_checks=ctx.policy.hash_checks)
    earned = not local.continued and record is not None and local.target.probed(record)
    if not local.continued:
        run.notes.append("every hunk is already in place; nothing was written")
    if earned or request.dry_run:
        early.cancel()
        if earned:
            run.notes.append("the patch set's probe passed on exactly these files with this interpreter in an earlier "
                             "run (its record is in the site folder): not compiled or probed again")
        elif patchset.probe is not None:
            run.notes.append("no passing probe is on record for these files with this interpreter: "
                             "apply without --dry-run compiles and probes them")
        for name in UNWRITTEN:
            run.skipped(name, "already applied" if earned else "dry run")
        return run.report("already-applied")

    no_probe = ctx.probe_skipped
    if not local.continued and no_probe is None:
        run.notes.append(f"no passing probe is on record for these files with this interpreter: "
                         f"{'compiled and ' if request.compile else ''}probed them before calling the tree applied")
    elif no_probe is not None:
        run.notes.append(f"no passing probe is on record for these files with this interpreter, and none was run "
                         f"({no_probe})")
    run.skipped("write", "already applied")
    reader = CachingReader(target)
    pyc_before = {pyc: reader(pyc) for pyc in bytecode_paths(plan, dist)}
    try:
        if request.compile:
            with run.step("compile"):
                compile_files(target, dist, plan, run)
        else:
            run.skipped("compile", "--no-compile")
        if no_probe is not None:
            early.cancel()
            run.skipped("probe", no_probe)
        else:
            assert patchset.probe is not None
            probe_step(target, dist, patchset.probe, run, patchset.probe_modules, early=early)
        settle(run, local, record, "already-applied", ctx.on_result)
    except BaseException:
        with run.step("restore", unwinding=True):
            if local.continued:
                local.target.roll_back()   # the interrupted run's pre-images, from its journal
                run.notes.append("the interrupted apply's files were rolled back to the pre-image")
            else:
                target.restore(bytecode_restore_plan(target, pyc_before, plan))
                run.notes.append("the tree was already patched before this run; only its bytecode was put back")
        raise
    return run.report("already-applied")


def write_layer(ctx: ApplyContext, writer: LayerWriter, written: list[str]) -> None:
    """--layer-out: the layer the `layer` step took, written whole (the tree is patched, compiled
    and probed by now; the run is not yet settled). Its path is added to `written` as soon as it
    is in place, for `drop_layer` should the run still fail."""
    path = ctx.request.layer_out
    assert path is not None and ctx.run.draft.layer is not None
    with ctx.run.step("layer out"):
        writer.write_layer(path)
        written.append(path)
    ctx.run.notes.append(f"wrote the new layer to {path}: {ctx.run.draft.layer.size} bytes, {ctx.run.draft.layer.diff_id}")


def drop_layer(written: list[str]) -> None:
    """The layer file this run wrote, removed again: the run did not end whole (a file that was
    there before the run is left alone unless this run had replaced it)."""
    for path in written:
        with contextlib.suppress(OSError):
            os.unlink(path)


def layer_writer(request: ApplyRequest, target: Target) -> LayerWriter | None:
    """The local tree whose layer --layer-out writes, or None (not asked)."""
    if request.layer_out is None:
        return None
    if not isinstance(target, LayerWriter) or isinstance(request.target, ImageSpec):
        raise BadInput("--layer-out writes the layer of a local tree (--root); an image's layer goes into the image",
                       hint="drop --layer-out, or run apply --root inside the image")
    return target
