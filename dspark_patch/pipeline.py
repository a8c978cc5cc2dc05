"""apply / verify / probe as steps: plan -> target -> report.

Each command opens its target, runs named, timed steps, and always returns an AuditReport —
a failed run included, with the error that stopped it. Nothing here prints: progress goes to
an optional `on_step` callback that the CLI renders.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Literal

from . import __version__
from .engine.diff import Diff, parse_diff
from .engine.plan import FilePlan, PatchPlan, plan_patch
from .errors import (
    BadInput,
    CompileFailed,
    DsparkPatchError,
    HashMismatch,
    InvalidPatchSet,
    LayerMismatch,
    ProbeFailed,
    VerifyMismatch,
)
from .inside import source as inside_source
from .patchset import PatchSet, Variant, resolve
from .probe.run import run_probe
from .report.model import (
    AuditReport,
    CompiledFile,
    CompileReport,
    DistributionInfo,
    ErrorReport,
    FileReport,
    HunkReport,
    ImageRef,
    IntegrityReport,
    LayerChange,
    LayerReport,
    PatchReport,
    ProbeReport,
    StepReport,
    TargetReport,
)
from .targets.base import Distribution, Target

LABEL_PREFIX = "io.github.dspark-patch"
StepCallback = Callable[[StepReport], None]


# --- requests (built by the CLI) -----------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class LocalSpec:
    root: str
    python: str | None = None


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    ref: str
    tag: str | None = None
    force: bool = False
    push: bool = False


TargetSpec = LocalSpec | ImageSpec


@dataclass(frozen=True, kw_only=True)
class ApplyRequest:
    target: TargetSpec
    patch: str | None = None
    strip: int | None = None
    dry_run: bool = False
    compile: bool = True
    probe: bool = True
    allow_unknown_base: bool = False


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    target: TargetSpec
    patch: str | None = None
    strip: int | None = None
    probe: bool = True


@dataclass(frozen=True, kw_only=True)
class ProbeRequest:
    target: TargetSpec


# --- the run's mutable record, frozen into the report at the end --------------------------
@dataclass(kw_only=True)
class _Run:
    command: Literal["apply", "verify", "probe"]
    target: TargetReport
    on_step: StepCallback | None
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    patch: PatchReport | None = None
    files: tuple[FileReport, ...] = ()
    compile: CompileReport = field(default_factory=lambda: CompileReport(ok=True, ran=False))
    probe: ProbeReport = field(default_factory=lambda: ProbeReport(ok=True, ran=False))
    integrity: IntegrityReport | None = None
    layer: LayerReport | None = None
    result_image: ImageRef | None = None
    labels: tuple[tuple[str, str], ...] = ()
    steps: list[StepReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
        except BaseException as exc:
            detail = exc.line() if isinstance(exc, DsparkPatchError) else type(exc).__name__
            self._record(StepReport(name=name, status="failed", seconds=time.monotonic() - start, detail=detail))
            raise
        self._record(StepReport(name=name, status="ok", seconds=time.monotonic() - start))

    def skipped(self, name: str, why: str) -> None:
        self._record(StepReport(name=name, status="skipped", seconds=0.0, detail=why))

    def _record(self, step: StepReport) -> None:
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)

    def report(self, status: str, error: DsparkPatchError | None = None) -> AuditReport:
        errors = ()
        if error is not None:
            errors = (ErrorReport(kind=error.kind, message=error.message, hint=error.hint, exit_code=error.exit_code),)
        return AuditReport(
            command=self.command,
            status="failed" if error is not None else status,  # type: ignore[arg-type]
            exit_code=error.exit_code if error is not None else 0,
            tool_version=__version__,
            started_at=self.started_at,
            target=self.target,
            patch=self.patch,
            files=self.files,
            compile=self.compile,
            probe=self.probe,
            integrity=self.integrity,
            layer=self.layer,
            result_image=self.result_image,
            labels=self.labels,
            steps=tuple(self.steps),
            errors=errors,
            notes=tuple(self.notes),
        )


# --- entry points -----------------------------------------------------------------------------
def apply(request: ApplyRequest, *, on_step: StepCallback | None = None) -> AuditReport:
    run = _Run(command="apply", target=_target_report(request.target), on_step=on_step)
    return _run(run, request.target, lambda target: _apply(request, target, run))


def verify(request: VerifyRequest, *, on_step: StepCallback | None = None) -> AuditReport:
    run = _Run(command="verify", target=_target_report(request.target), on_step=on_step)
    return _run(run, request.target, lambda target: _verify(request, target, run))


def probe(request: ProbeRequest, *, on_step: StepCallback | None = None) -> AuditReport:
    run = _Run(command="probe", target=_target_report(request.target), on_step=on_step)

    def steps(target: Target) -> AuditReport:
        patchset = resolve(None)
        with run.step("locate"):
            dist = target.locate(patchset.distribution)
        run.target = _with_dist(run.target, dist)
        _probe(target, dist, run)
        return run.report("probed")

    return _run(run, request.target, steps)


def _run(run: _Run, spec: TargetSpec, steps: Callable[[Target], AuditReport]) -> AuditReport:
    """Open the target, run the steps, close the target (removing any container), report."""
    target: Target | None = None
    try:
        with ExitStack() as stack:
            target = _open(spec, run, stack)
            report = steps(target)
    except DsparkPatchError as exc:
        report = run.report("failed", exc)
    # Notes the target gathered while closing (a kept container, leftovers it removed).
    notes = tuple(getattr(target, "notes", ()))
    return replace(report, notes=report.notes + notes) if notes else report


# --- steps --------------------------------------------------------------------------------
def _apply(request: ApplyRequest, target: Target, run: _Run) -> AuditReport:
    with run.step("load patch"):
        patchset = resolve(request.patch, strip=request.strip)
    with run.step("locate"):
        dist = target.locate(patchset.distribution)
    run.target = _with_dist(run.target, dist)
    variant, diff = _select(patchset, dist, request.strip, run)
    if isinstance(request.target, ImageSpec) and request.target.tag and not request.dry_run:
        target.refuse_existing_tag(request.target.tag, force=request.target.force)  # type: ignore[attr-defined]
    reader = _CachingReader(target)
    hash_checks = not patchset.is_bare and not request.allow_unknown_base
    run.patch = replace(run.patch, hash_checks=hash_checks)  # type: ignore[arg-type]
    if request.allow_unknown_base and not patchset.is_bare:
        run.notes.append("--allow-unknown-base: pre-image hashes not enforced; relying on zero-fuzz placement alone")

    with run.step("plan"):
        if hash_checks:  # before placing hunks: "not the reviewed file" is the clearer message
            _check_known_images(diff, variant, dist, reader)
        plan = plan_patch(diff, reader)
        run.files = _file_reports(plan, variant)
        if not patchset.is_bare:
            _check_post_images(plan, variant, enforce=hash_checks or plan.status == "already-applied")

    if plan.status == "already-applied":
        run.notes.append("every hunk is already in place; nothing was written")
        for name in ("write", "compile", "probe"):
            run.skipped(name, "already applied")
        if isinstance(request.target, ImageSpec) and request.target.tag and not request.dry_run:
            # Like a cached `docker build`: the name the caller asked for points at the
            # image that already carries the patch, so a following verify/push finds it.
            with run.step("tag"):
                tagged = target.tag_source(request.target.tag, force=request.target.force)  # type: ignore[attr-defined]
            run.result_image = ImageRef(ref=tagged.ref, id=tagged.id)
            run.notes.append(f"tagged the source image as {tagged.ref}; no new layer")
        return run.report("already-applied")
    if request.dry_run:
        for name in ("write", "compile", "probe"):
            run.skipped(name, "dry run")
        return run.report("dry-run")

    probe_wanted = request.probe and bool(patchset.probe)
    image = request.target if isinstance(request.target, ImageSpec) else None
    pyc_before = {pyc: reader(pyc) for pyc in _bytecode_paths(plan, dist)}
    with ExitStack() as scratch:
        # For an image the probe runs in a twin container while this one's changes are listed.
        pending_probe = _probe_in_twin(target, dist, plan, run, scratch) if image and probe_wanted else None
        with run.step("write"):
            target.write(plan)
        try:
            if request.compile:
                with run.step("compile"):
                    _compile(target, dist, plan, run)
            else:
                run.skipped("compile", "--no-compile")
            if image is None:
                if probe_wanted:
                    _probe(target, dist, run)
                else:
                    run.skipped("probe", "--no-probe" if not request.probe else "this patch set has no probe")
                return run.report("applied")
            _check_layer(target, dist, plan, run)
            if pending_probe is not None:
                _await_probe(pending_probe, run)
            else:
                run.skipped("probe", "--no-probe" if not request.probe else "this patch set has no probe")
            _commit_image(image, target, plan, patchset, variant, run)
        except BaseException:
            with run.step("restore"):
                target.restore(_bytecode_restore_plan(target, pyc_before, plan))
                target.restore(plan)
            raise
    return run.report("applied")


def _verify(request: VerifyRequest, target: Target, run: _Run) -> AuditReport:
    with run.step("load patch"):
        patchset = resolve(request.patch, strip=request.strip)
    with run.step("locate"):
        dist = target.locate(patchset.distribution)
    run.target = _with_dist(run.target, dist)
    variant, diff = _select(patchset, dist, request.strip, run)
    reader = _CachingReader(target)
    problems: list[str] = []

    with run.step("patched files"):
        for fp in diff.files:
            current = reader(fp.path)
            current_sha = _sha(current)
            expected = variant.files.get(fp.path)
            expected_post = expected.post_sha256 if expected else None
            expected_pre = expected.pre_sha256 if expected else None
            run.files += (FileReport(path=fp.path, action=fp.action, pre_sha256=None, post_sha256=current_sha,
                                     expected_pre_sha256=expected_pre, expected_post_sha256=expected_post),)
        if patchset.is_bare:
            plan = _plan_or_none(diff, reader)
            if plan is None or plan.status != "already-applied":
                problems.append("the diff is not applied to this tree")
        else:
            for fr in run.files:
                if fr.post_sha256 == fr.expected_post_sha256:
                    continue
                state = "unpatched (it is the pre-image)" if fr.post_sha256 == fr.expected_pre_sha256 and fr.post_sha256 else (
                    "missing" if fr.post_sha256 is None else "changed (neither pre- nor post-image)")
                problems.append(f"{fr.path} is {state}")

    with run.step("integrity"):
        run.integrity = _integrity(target, dist, diff)
        i = run.integrity
        problems += [f"{p}: does not match RECORD" for p in i.mismatched]
        problems += [f"{p}: missing (listed in RECORD)" for p in i.missing]
        problems += list(i.stale_bytecode)

    if isinstance_image(target):
        with run.step("labels"):
            problems += _check_labels(target, variant, patchset)

    if request.probe and patchset.probe:
        try:
            _probe(target, dist, run)
        except ProbeFailed as exc:
            problems.append(exc.message)
    else:
        run.skipped("probe", "--no-probe" if not request.probe else "this patch set has no probe")

    if problems:
        more = f" (and {len(problems) - 3} more; see the report)" if len(problems) > 3 else ""
        raise VerifyMismatch(
            f"{run.target.ref} does not carry exactly {_patch_name(patchset, variant)}: " + "; ".join(problems[:3]) + more,
            hint="apply the patch to a pristine release, or rebuild the image",
        )
    return run.report("verified")


def _select(patchset: PatchSet, dist: Distribution, strip: int | None, run: _Run) -> tuple[Variant, Diff]:
    variant = patchset.variants[0] if patchset.is_bare else patchset.variant_for(dist.version)
    run.patch = PatchReport(
        id=patchset.id, variant=None if patchset.is_bare else variant.name, sha256=variant.diff_sha256,
        source=str(variant.diff_path), hash_checks=not patchset.is_bare,
    )
    if patchset.is_bare:
        run.notes.append("bare diff file: release and hash checks skipped")
    try:
        diff = parse_diff(variant.diff, strip=patchset.strip if strip is None else strip)
    except BadInput as exc:  # the engine parses bytes; name the file they came from
        raise type(exc)(f"{variant.diff_path}: {exc.message}", hint=exc.hint) from None
    if not patchset.is_bare:
        in_diff = {fp.path for fp in diff.files}
        if in_diff != set(variant.files):
            raise InvalidPatchSet(
                f"patch set {patchset.id} variant {variant.name}: the diff touches {sorted(in_diff)} "
                f"but patch.toml lists hashes for {sorted(variant.files)}",
                hint="list every file of the diff under [variants.files]",
            )
    return variant, diff


def _check_known_images(diff: Diff, variant: Variant, dist: Distribution, reader: "_CachingReader") -> None:
    """Each target file must be the reviewed pre-image (matching RECORD) or, if already patched, the post-image."""
    record = {e.path: e.sha256 for e in dist.record}
    for fp in diff.files:
        expected = variant.files[fp.path]
        actual = _sha(reader(fp.path))
        if actual == expected.post_sha256:
            continue
        if actual != expected.pre_sha256:
            raise HashMismatch(
                f"{fp.path}: sha256 {actual or '(missing)'} is not the {variant.name} pre-image {expected.pre_sha256}",
                hint="the installed file was changed; reinstall the release, or pass --allow-unknown-base to rely on zero-fuzz placement",
            )
        if record.get(fp.path) not in (None, expected.pre_sha256):
            raise HashMismatch(
                f"{fp.path}: RECORD says sha256 {record[fp.path]}, the patch set expects {expected.pre_sha256}",
                hint="this is not the release's own file list; reinstall the release",
            )


def _check_post_images(plan: PatchPlan, variant: Variant, *, enforce: bool) -> None:
    for fp in plan.files:
        expected = variant.files[fp.path].post_sha256
        if enforce and fp.post_sha256 != expected:
            raise HashMismatch(
                f"{fp.path}: the result would have sha256 {fp.post_sha256 or 'none'}, not the reviewed post-image {expected}",
                hint="the tree differs from the reviewed release; nothing was written",
            )


def _compile(target: Target, dist: Distribution, plan: PatchPlan, run: _Run) -> None:
    paths = [fp.path for fp in plan.files if fp.post is not None and fp.path.endswith(".py")]
    if not paths:
        run.compile = CompileReport(ok=True, ran=True)
        return
    result = target.run_python(inside_source("compile"), [f"{dist.location}/{p}" for p in paths], timeout=300)
    try:
        rows = json.loads(result.stdout.decode("utf-8"))["files"]
    except (ValueError, KeyError):
        raise CompileFailed(
            f"byte-compiling with {dist.python} failed: {result.stderr.decode('utf-8', 'replace').strip()[-300:]}",
            hint="the pre-images were restored",
        ) from None
    files = tuple(
        CompiledFile(path=rel, ok=bool(row["ok"]), detail=row["detail"]) for rel, row in zip(paths, rows, strict=True)
    )
    run.compile = CompileReport(ok=all(f.ok for f in files), ran=True, files=files)
    bad = [f for f in files if not f.ok]
    if bad:
        raise CompileFailed(
            f"{bad[0].path} does not compile with {dist.python} ({dist.python_version}): {bad[0].detail}",
            hint="the pre-images were restored; the patch does not suit this interpreter",
        )


def _probe(target: Target, dist: Distribution, run: _Run) -> None:
    with run.step("probe"):
        run.probe = run_probe(target, dist)
        if not run.probe.ok:
            raise ProbeFailed(f"the consumer probe failed: {run.probe.detail}", hint="see the probe cases in the report")


def _integrity(target: Target, dist: Distribution, diff: Diff) -> IntegrityReport:
    if dist.record_file is None:
        return IntegrityReport(checked=0, not_checked=("RECORD missing",))
    py_files = [fp.path for fp in diff.files if fp.action != "delete" and fp.path.endswith(".py")]
    request = {"location": dist.location, "record": dist.record_file,
               "skip": [fp.path for fp in diff.files], "bytecode": py_files}
    result = target.run_python(inside_source("integrity"), [json.dumps(request)], timeout=600)
    try:
        doc = json.loads(result.stdout.decode("utf-8"))
    except ValueError:
        raise VerifyMismatch(
            f"the integrity check could not run with {dist.python}: {result.stderr.decode('utf-8', 'replace').strip()[-300:]}"
        ) from None
    stale = tuple(f"{path}: {why}" for path, why in doc["bytecode"].items() if why)
    return IntegrityReport(checked=doc["checked"], mismatched=tuple(doc["mismatched"]), missing=tuple(doc["missing"]),
                           not_checked=tuple(doc["not_checked"]), stale_bytecode=stale)


def _bytecode_paths(plan: PatchPlan, dist: Distribution) -> list[str]:
    """The cached-bytecode path (relative to location) of every patched module."""
    paths = []
    for fp in plan.files:
        if fp.path.endswith(".py"):
            folder, _, name = fp.path.rpartition("/")
            paths.append(f"{folder + '/' if folder else ''}__pycache__/{name[:-3]}.{dist.cache_tag}.pyc")
    return paths


def _bytecode_restore_plan(target: Target, before: dict[str, bytes | None], plan: PatchPlan) -> PatchPlan:
    """A plan whose restore puts each module's previous .pyc back (or removes one we created)."""
    files = []
    for pyc, old in before.items():
        now = target.read(pyc)
        if now != old:
            files.append(FilePlan(path=pyc, action="modify" if old is not None and now is not None else "add",
                                  pre=old, post=now, pre_sha256=_sha(old), post_sha256=_sha(now), placements=()))
    return PatchPlan(status="apply", diff_sha256=plan.diff_sha256, files=tuple(files))


# --- image-only steps --------------------------------------------------------------------------
def isinstance_image(target: Target) -> bool:
    return target.info.kind == "image"


def _probe_in_twin(target: Target, dist: Distribution, plan: PatchPlan, run: _Run, scratch: ExitStack) -> Future:
    """Start the probe in a twin container of the source image holding the same post-images.

    Nothing the probe does can reach the committed layer, and it overlaps the engine's slow
    listing of this container's changes. The twin is entered here, in the main thread (its
    SIGTERM handling needs that); on any failure it is removed before the worker is awaited."""
    pool = scratch.enter_context(ThreadPoolExecutor(max_workers=1, thread_name_prefix="probe"))
    with run.step("probe container"):
        twin = scratch.enter_context(target.twin())  # type: ignore[attr-defined]

    def job() -> tuple[ProbeReport, float]:
        start = time.monotonic()
        twin.write(plan)
        return run_probe(twin, dist), time.monotonic() - start

    run.notes.append("the probe ran in a disposable twin container of the source image holding the same "
                     "post-images; it was removed afterwards, so nothing the probe did is in the result")
    return pool.submit(job)


def _await_probe(pending: Future, run: _Run) -> None:
    start = time.monotonic()
    try:
        report, seconds = pending.result()
    except DsparkPatchError as exc:
        run._record(StepReport(name="probe", status="failed", seconds=time.monotonic() - start, detail=exc.line()))
        raise
    run.probe = report
    waited = time.monotonic() - start
    detail = f"in a twin container; {waited:.2f}s of it not overlapped with the layer scan"
    run._record(StepReport(name="probe", status="ok" if report.ok else "failed", seconds=seconds, detail=detail))
    if not report.ok:
        raise ProbeFailed(f"the consumer probe failed: {report.detail}", hint="see the probe cases in the report")


def _check_layer(target: Target, dist: Distribution, plan: PatchPlan, run: _Run) -> None:
    with run.step("layer"):
        changes = tuple(LayerChange(kind=k, path=p) for k, p in target.changes())  # type: ignore[attr-defined]
        expected = _expected_layer(plan, dist)
        unexpected = tuple(c for c in changes if c.path not in expected)
        run.layer = LayerReport(ok=not unexpected, changes=changes, unexpected=unexpected)
        if unexpected:
            shown = ", ".join(f"{c.kind} {c.path}" for c in unexpected[:5])
            raise LayerMismatch(
                f"the container changed more than the patched files: {shown}",
                hint="nothing was committed; report this as a bug with the audit report",
            )


def _commit_image(spec: ImageSpec, target: Target, plan: PatchPlan, patchset: PatchSet, variant: Variant, run: _Run) -> None:
    labels = _labels(patchset, variant, plan, run)
    run.labels = tuple(sorted(labels.items()))
    with run.step("commit"):
        committed = target.commit(labels=labels, tag=spec.tag, force=spec.force)  # type: ignore[attr-defined]
    run.result_image = ImageRef(ref=committed.ref, id=committed.id)
    if spec.push and spec.tag:
        with run.step("push"):
            digest = target.push(spec.tag)  # type: ignore[attr-defined]
        repository = spec.tag.rsplit(":", 1)[0] if ":" in spec.tag.rsplit("/", 1)[-1] else spec.tag
        run.result_image = replace(run.result_image, repo_digest=f"{repository}@{digest}")
        run.notes.append(f"pushed {spec.tag} as {repository}@{digest}")


def _expected_layer(plan: PatchPlan, dist: Distribution) -> set[str]:
    paths = {f"{dist.location}/{pyc}" for pyc in _bytecode_paths(plan, dist)}
    for fp in plan.files:
        full = f"{dist.location}/{fp.path}"
        paths.add(full)
        if fp.path.endswith(".py") and fp.post is not None:
            folder = full.rpartition("/")[0]
            paths.add(f"{folder}/__pycache__")
        # every folder above a changed file shows as changed ("C") in the container's diff
        parts = full.split("/")
        for i in range(2, len(parts)):
            paths.add("/".join(parts[:i]))
    return paths


def _labels(patchset: PatchSet, variant: Variant, plan: PatchPlan, run: _Run) -> dict[str, str]:
    files = {fp.path: fp.post_sha256 for fp in plan.files}
    labels = {
        f"{LABEL_PREFIX}.patch.id": patchset.id or "bare-diff",
        f"{LABEL_PREFIX}.patch.variant": variant.name,
        f"{LABEL_PREFIX}.patch.sha256": variant.diff_sha256,
        f"{LABEL_PREFIX}.files": json.dumps(files, sort_keys=True, separators=(",", ":")),
        f"{LABEL_PREFIX}.tool-version": __version__,
    }
    # The report digest covers the audit as it stood before the commit (the result image id cannot
    # be inside its own label); the final report carries these labels for cross-checking.
    pre_commit = json.dumps(_digestable(run), sort_keys=True, separators=(",", ":"))
    labels[f"{LABEL_PREFIX}.report.sha256"] = hashlib.sha256(pre_commit.encode()).hexdigest()
    return labels


def _digestable(run: _Run) -> dict:
    return {
        "patch": run.patch and {"id": run.patch.id, "variant": run.patch.variant, "sha256": run.patch.sha256},
        "files": [{"path": f.path, "pre": f.pre_sha256, "post": f.post_sha256,
                   "hunks": [(h.source_start, h.applied_at, h.offset, h.fuzz) for h in f.hunks]} for f in run.files],
        "compile": run.compile.ok, "probe": [(c.name, c.ok) for c in run.probe.cases],
        "layer": [(c.kind, c.path) for c in run.layer.changes] if run.layer else [],
        "source_image": run.target.image and run.target.image.id,
    }


def _check_labels(target: Target, variant: Variant, patchset: PatchSet) -> list[str]:
    labels = target.source.config.get("Labels") or {}  # type: ignore[attr-defined]
    problems = []
    files_label = labels.get(f"{LABEL_PREFIX}.files")
    if files_label is None:
        return [f"the image has no {LABEL_PREFIX}.* labels (it was not made by dspark-patch apply)"]
    if labels.get(f"{LABEL_PREFIX}.patch.id") != (patchset.id or "bare-diff"):
        problems.append(f"label {LABEL_PREFIX}.patch.id is {labels.get(f'{LABEL_PREFIX}.patch.id')!r}")
    if labels.get(f"{LABEL_PREFIX}.patch.sha256") != variant.diff_sha256:
        problems.append(f"label {LABEL_PREFIX}.patch.sha256 does not match the diff")
    try:
        files = json.loads(files_label)
    except ValueError:
        return problems + [f"label {LABEL_PREFIX}.files is not JSON"]
    if not patchset.is_bare:
        want = {p: h.post_sha256 for p, h in variant.files.items()}
        if files != want:
            problems.append(f"label {LABEL_PREFIX}.files does not list the reviewed post-image hashes")
    return problems


# --- helpers ------------------------------------------------------------------------------------
class _CachingReader:
    """Reads each file of the target once (an image read is a get_archive round trip)."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._cache: dict[str, bytes | None] = {}

    def __call__(self, path: str) -> bytes | None:
        if path not in self._cache:
            self._cache[path] = self._target.read(path)
        return self._cache[path]


def _plan_or_none(diff: Diff, reader: _CachingReader) -> PatchPlan | None:
    try:
        return plan_patch(diff, reader)
    except DsparkPatchError:
        return None


def _file_reports(plan: PatchPlan, variant: Variant) -> tuple[FileReport, ...]:
    reports = []
    for fp in plan.files:
        expected = variant.files.get(fp.path)
        reports.append(FileReport(
            path=fp.path, action=fp.action, pre_sha256=fp.pre_sha256, post_sha256=fp.post_sha256,
            expected_pre_sha256=expected.pre_sha256 if expected else None,
            expected_post_sha256=expected.post_sha256 if expected else None,
            hunks=tuple(HunkReport(index=p.hunk_index, source_start=p.source_start, applied_at=p.applied_at,
                                   offset=p.offset, fuzz=p.fuzz) for p in fp.placements),
        ))
    return tuple(reports)


def _sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def _patch_name(patchset: PatchSet, variant: Variant) -> str:
    return f"{patchset.id} ({variant.name})" if patchset.id else f"the diff {variant.diff_path.name}"


def _target_report(spec: TargetSpec) -> TargetReport:
    if isinstance(spec, LocalSpec):
        return TargetReport(kind="local", ref=spec.root, python=spec.python)
    return TargetReport(kind="image", ref=spec.ref)


def _with_dist(report: TargetReport, dist: Distribution) -> TargetReport:
    return replace(report, python=dist.python, python_version=dist.python_version,
                   distribution=DistributionInfo(name=dist.name, version=dist.version, location=dist.location))


def _open(spec: TargetSpec, run: _Run, stack: ExitStack) -> Target:
    with run.step("open target"):
        if isinstance(spec, LocalSpec):
            from .targets.local import LocalTree

            return LocalTree(spec.root, python=spec.python)
        from .targets.image import ImageTarget

        target = stack.enter_context(ImageTarget(spec.ref))
        run.target = replace(run.target, image=ImageRef(ref=spec.ref, id=target.info.id or ""))
        return target
