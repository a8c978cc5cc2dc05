"""Steps shared by apply and verify, on any target: choose the variant, check hashes,
byte-compile, probe. Each takes the target as a parameter. The check against the published
wheel is integrity_check.py's."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .. import series as series_mod
from ..errors import (
    CheckFailed,
    CompileFailed,
    DsparkPatchError,
    HashMismatch,
    InvalidSeries,
    ProbeFailed,
)
from ..inside import source as inside_source
from ..inside.answers import CompiledRow, MalformedAnswer, decode_compile
from ..patching.diff import Diff
from ..patching.plan import FilePlan, PatchPlan, plan_patch
from ..patchset import PatchSet, Variant
from ..probe.prestart import EarlyProbe
from ..probe.run import run_probe, start_probe_early
from ..report.model import CompiledFile, CompileReport, FileReport, HunkReport, PatchReport, ProbeReport
from ..targets.base import Distribution, Target
from . import series_steps, supersede
from .diff_checks import load_diff
from .policy import CheckPolicy
from .runlog import RunLog, with_distribution


def prepare(run: RunLog, target: Target, patches: tuple[str, ...], strip: int | None, *, series_file: str | None = None,
            after_load: Callable[[PatchSet], None] | None = None, allow_unknown_base: bool = False,
            allow_unreviewed: bool = False, probe: bool = True,
            after_locate: Callable[[Distribution], None] | None = None) -> Prepared:
    """Load the patch set (or the series) and derive its check policy, find the installed
    distribution, pick the variant and parse its diff (`after_load` runs between the first two:
    the probe may start early there; `after_locate` once the distribution is found). A series of
    several is folded into the one change it makes (series_steps.py); its members are in
    `folded`. `probe`: False for --no-probe (a superseded set cannot then be proven)."""
    with run.step("load patch"):
        series = series_mod.load(patches, series_file=series_file, strip=strip)
    lead = next((p for p in series if p.probe is not None), series.sets[0])
    policy = CheckPolicy.of(lead, allow_unknown_base=allow_unknown_base, allow_unreviewed=allow_unreviewed)
    bare = next((p for p in series if p.is_bare), None)
    if len(series) > 1 and bare is not None:
        raise InvalidSeries(f"the bare diff {series_mod.name_of(bare)} cannot be part of a series of several patch sets",
                            hint="make it a patch set (patch.toml with its hashes) to put it in a series, or apply it alone")
    if after_load is not None:
        after_load(lead)
    with run.step("locate"):
        dist = target.locate(lead.distribution)
    run.update(target=with_distribution(run.draft.target, dist))
    if after_locate is not None:
        after_locate(dist)
    early = after_load if isinstance(after_load, EarlyStart) else None
    series = _carried(series, target, dist, run, probe=probe, allow_unreviewed=allow_unreviewed, early=early)
    lead = next((p for p in series if p.probe is not None), series.sets[0])
    if len(series) == 1:
        variant, diff = select_variant(lead, policy, dist, strip, run)
        return Prepared(patchset=lead, policy=policy, dist=dist, variant=variant, diff=diff)
    chosen = series_steps.members(series, dist, strip)
    series_steps.check_shared_files(series, chosen)
    folded = series_steps.fold(series, chosen, dist)
    run.update(patch=PatchReport(id=folded.id, variant=folded.variant.name, sha256=folded.variant.diff_sha256,
                                 source=" + ".join(_member_source(m.patchset, m.variant) for m in chosen),
                                 hash_checks=True, review=folded.variant.review),
               series=tuple(PatchReport(id=m.patchset.id, variant=m.variant.name, sha256=m.variant.diff_sha256,
                                        source=_member_source(m.patchset, m.variant), hash_checks=True,
                                        review=m.variant.review) for m in chosen))
    return Prepared(patchset=folded.patchset, policy=policy, dist=dist, variant=folded.variant, diff=folded.diff,
                    folded=folded)


class AllUpstream(Exception):
    """Every patch set named is upstream in the installed release: there is nothing to carry
    (the notes say so). Not an error: apply and verify end on it as they end on a tree that
    carries the patch."""

    def __init__(self, dist: Distribution) -> None:
        super().__init__(dist.version)
        self.dist = dist


def _carried(series: series_mod.Series, target: Target, dist: Distribution, run: RunLog, *, probe: bool,
             allow_unreviewed: bool, early: EarlyStart | None) -> series_mod.Series:
    """The members still to carry: a patch set with no variant for the installed release whose
    change that release already has is upstream, skipped with a note naming the release; one
    whose `superseded` record names the release is proven there (supersede.py) and skipped."""
    kept = []
    for patchset in series:
        record = patchset.superseded_for(dist.version)
        if record is not None:
            proven = supersede.prove(patchset, record, target, dist, run, probe=probe,
                                     allow_unreviewed=allow_unreviewed,
                                     early=early.take() if early is not None else None)
            run.update(superseded=(*run.draft.superseded, proven))
            run.notes.append(supersede.note(proven, dist.name))
            continue
        found = series_mod.upstream(patchset, target.read, dist.version)
        if found is None:
            kept.append(patchset)
        else:
            run.notes.append(f"{series_mod.name_of(patchset)} is upstream in {dist.name} {dist.version}: the release "
                             f"already has the change of its variant {found.name}; skipped")
    if not kept:
        raise AllUpstream(dist)
    return series_mod.Series(tuple(kept))


def _member_source(patchset: PatchSet, variant: Variant) -> str:
    """A series member's diff as the report names it: its id, then patch_source's path."""
    return f"{patchset.id}/{patch_source(patchset, CheckPolicy.of(patchset), variant)}"


@dataclass(frozen=True, kw_only=True)
class Prepared:
    patchset: PatchSet
    policy: CheckPolicy
    dist: Distribution
    variant: Variant
    diff: Diff
    folded: series_steps.Folded | None = None   # a series of several: its members


class CachingReader:
    """Reads each file of the target once (an image read is a get_archive round trip)."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._cache: dict[str, bytes | None] = {}

    def __call__(self, path: str) -> bytes | None:
        if path not in self._cache:
            self._cache[path] = self._target.read(path)
        return self._cache[path]

    def prefetch(self, paths: Iterable[str]) -> None:
        """Read the files not read yet, at once (each an archive round trip on an image)."""
        self._cache.update(read_many(self._target, [p for p in dict.fromkeys(paths) if p not in self._cache]))


def read_many(target: Target, paths: list[str]) -> dict[str, bytes | None]:
    """Several files of the target, read side by side (an image's reads are independent round
    trips to the engine, as the write's own reads of the current files are)."""
    if len(paths) <= 1:
        return {path: target.read(path) for path in paths}
    with ThreadPoolExecutor(max_workers=min(8, len(paths)), thread_name_prefix="dspark-patch-read") as pool:
        return dict(zip(paths, pool.map(target.read, paths), strict=True))


def patch_source(patchset: PatchSet, policy: CheckPolicy, variant: Variant) -> str:
    """The diff's path relative to its patch set's folder (a bare diff: its file name).

    Never the host path it was read from: the report is signed and published, and the same
    patch must give the same `patch` section on every machine and checkout."""
    if not policy.release_checks:
        return variant.diff_path.name
    return variant.diff_path.relative_to(patchset.source.resolve()).as_posix()


def select_variant(patchset: PatchSet, policy: CheckPolicy, dist: Distribution, strip: int | None,
                   run: RunLog) -> tuple[Variant, Diff]:
    """A bare diff is its own one variant; the report's `hash_checks` is the patch set's kind
    here (apply narrows it to the policy's once it plans)."""
    reviewed = policy.release_checks
    variant = patchset.variant_for(dist.version) if reviewed else patchset.variants[0]
    run.update(patch=PatchReport(
        id=patchset.id, variant=variant.name if reviewed else None, sha256=variant.diff_sha256,
        source=patch_source(patchset, policy, variant), hash_checks=reviewed,
        review=variant.review if reviewed else None,
    ))
    if not reviewed:
        run.notes.append("bare diff file: release and hash checks skipped")
    return variant, load_diff(patchset, variant, dist, strip, reviewed=reviewed)


def check_known_images(diff: Diff, variant: Variant, dist: Distribution, reader: CachingReader) -> None:
    """Each target file must be the reviewed pre-image (matching RECORD) or, if already patched, the post-image."""
    record = {e.path: e.sha256 for e in dist.record}
    for fp in diff.files:
        expected = variant.files[fp.path]
        actual = sha256_of(reader(fp.path))
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


def check_post_images(plan: PatchPlan, variant: Variant, *, enforce: bool) -> None:
    for fp in plan.files:
        expected = variant.files[fp.path].post_sha256
        if enforce and fp.post_sha256 != expected:
            raise HashMismatch(
                f"{fp.path}: the result would have sha256 {fp.post_sha256 or 'none'}, not the reviewed post-image {expected}",
                hint="the tree differs from the reviewed release; nothing was written",
            )


def check_written(target: Target, plan: PatchPlan) -> None:
    """After the write, each file of the plan read back from the tree: it must hold the planned
    post-image (gone, for a deletion). Two entries of a diff that are one file, or anything else
    that wrote there meanwhile, fail the run here (the caller restores the pre-images)."""
    now = read_many(target, [fp.path for fp in plan.files])
    for fp in plan.files:
        found = sha256_of(now[fp.path])
        if found != fp.post_sha256:
            raise CheckFailed(
                f"{fp.path}: after the write it holds {found or 'nothing'}, not the planned post-image "
                f"{fp.post_sha256 or '(deleted)'}",
                hint="two entries of the diff may be one file, or something else writes to the tree; the pre-images were restored",
            )


def compiled_rows(target: Target, dist: Distribution, paths: list[str], *,
                  hint: str | None = None) -> tuple[CompiledRow, ...]:
    """Byte-compile `paths` (relative to the distribution's location) with the target's own
    python: its row for each path, in order. CompileFailed (with `hint`) when it gives no rows,
    naming what it said on stderr, or its exit code when it said nothing; or when its answer is
    not one row per path."""
    args = [f"{dist.location}/{p}" for p in paths]
    result = target.run_python(inside_source("compile"), args, timeout=300)
    if result.returncode == 0 and not result.stdout and not result.stderr:
        # The engine can drop a quick exec's whole output under load (moby/moby#27289,
        # docker/docker-py#2042): the script always prints its rows, so nothing at all with exit 0
        # is the engine's loss, not the script's answer. Compiling is idempotent: ask once more.
        result = target.run_python(inside_source("compile"), args, timeout=300)
    try:
        doc = json.loads(result.stdout.decode("utf-8"))
    except ValueError:
        said = result.stderr.decode("utf-8", "replace").strip()[-300:] or f"exit {result.returncode}, nothing on stderr"
        raise CompileFailed(f"byte-compiling with {dist.python} failed: {said}", hint=hint) from None
    try:
        return decode_compile(doc, len(paths))
    except MalformedAnswer as exc:
        raise CompileFailed(f"byte-compiling with {dist.python} failed: {exc}", hint=hint) from None


def compile_files(target: Target, dist: Distribution, plan: PatchPlan, run: RunLog) -> None:
    paths = [fp.path for fp in plan.files if fp.post is not None and fp.path.endswith(".py")]
    if not paths:
        run.update(compile=CompileReport(ok=True, ran=True))
        return
    rows = compiled_rows(target, dist, paths, hint="the pre-images were restored")
    files = tuple(
        CompiledFile(path=rel, ok=row.ok, detail=row.detail) for rel, row in zip(paths, rows, strict=True)
    )
    run.update(compile=CompileReport(ok=all(f.ok for f in files), ran=True, files=files))
    bad = [f for f in files if not f.ok]
    if bad:
        raise CompileFailed(
            f"{bad[0].path} does not compile with {dist.python} ({dist.python_version}): {bad[0].detail}",
            hint="the pre-images were restored; the patch does not suit this interpreter",
        )


def probe_failure(report: ProbeReport) -> ProbeFailed:
    return ProbeFailed(f"the patch set's probe failed: {report.detail}", hint="see the probe cases in the report")


class EarlyStart:
    """The probe started early (probe/prestart.py), once the patch set names it: its
    interpreter and imports overlap locate, plan, write, compile and layer."""

    def __init__(self, target: Target, *, wanted: bool) -> None:
        self._target, self._wanted = target, wanted
        self.probe: EarlyProbe | None = None

    def __call__(self, patchset: PatchSet) -> None:
        if self._wanted and patchset.probe is not None:
            self.probe = start_probe_early(self._target, patchset.probe, modules=patchset.probe_modules,
                                           distribution=patchset.distribution, beside=patchset.probe_beside)

    def cancel(self) -> None:
        probe, self.probe = self.probe, None
        if probe is not None:
            probe.cancel()

    def take(self) -> EarlyProbe | None:
        probe, self.probe = self.probe, None
        return probe


def probe_step(target: Target, dist: Distribution, probe: Path, run: RunLog, modules: tuple[Path, ...] = (), *,
               early: EarlyStart | None = None) -> None:
    with run.step("probe"):
        started = early.take() if early is not None else None
        probed = run_probe(target, dist, probe, modules=modules, early=started)
        if started is not None and started.unused:
            run.notes.append(f"the probe started early could not be used ({started.unused}); it ran afresh")
        run.update(probe=probed)
        if not probed.ok:
            raise probe_failure(probed)


def cached_name(source: str, tag: str) -> str:
    """a/m.py -> a/__pycache__/m.<tag>.pyc (importlib.util.cache_from_source, for another interpreter)."""
    folder, _, name = source.rpartition("/")
    return f"{folder + '/' if folder else ''}__pycache__/{name[:-3]}.{tag}.pyc"


def bytecode_paths(plan: PatchPlan, dist: Distribution) -> list[str]:
    """The cached-bytecode path (relative to location) of every patched module."""
    paths = []
    for fp in plan.files:
        if fp.path.endswith(".py"):
            paths.append(cached_name(fp.path, dist.cache_tag))
    return paths


def bytecode_restore_plan(target: Target, before: dict[str, bytes | None], plan: PatchPlan) -> PatchPlan:
    """A plan whose restore puts each module's previous .pyc back (or removes one we created)."""
    files = []
    for pyc, old in before.items():
        now = target.read(pyc)
        if now != old:
            files.append(FilePlan(path=pyc, action="modify" if old is not None and now is not None else "add",
                                  pre=old, post=now, pre_sha256=sha256_of(old), post_sha256=sha256_of(now), placements=()))
    return PatchPlan(status="apply", diff_sha256=plan.diff_sha256, files=tuple(files))


def plan_or_none(diff: Diff, reader: CachingReader) -> PatchPlan | None:
    try:
        return plan_patch(diff, reader)
    except DsparkPatchError:
        return None


def file_reports(plan: PatchPlan, variant: Variant) -> tuple[FileReport, ...]:
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


def sha256_of(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def patch_name(patchset: PatchSet, variant: Variant) -> str:
    return f"{patchset.id} ({variant.name})" if patchset.id else f"the diff {variant.diff_path.name}"
