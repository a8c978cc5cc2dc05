"""Steps shared by apply and verify, on any target: choose the variant, check hashes,
byte-compile, probe, check integrity. Each takes the target as a parameter."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from .. import references
from ..errors import (
    BadInput,
    CheckFailed,
    CompileFailed,
    DsparkPatchError,
    HashMismatch,
    InvalidPatchSet,
    MalformedPatch,
    ModifiedBase,
    ProbeFailed,
    UnsafePatch,
    VerifyMismatch,
)
from ..inside import source as inside_source
from ..inside.integrity import own_folders
from ..patching.diff import Diff, parse_diff
from ..patching.plan import FilePlan, PatchPlan, plan_patch
from ..patchset import PatchSet, Variant, resolve
from ..probe.prestart import EarlyProbe
from ..probe.run import run_probe, start_probe_early
from ..report.model import CompiledFile, CompileReport, FileReport, HunkReport, IntegrityReport, PatchReport, ProbeReport
from ..targets import kept, proofs
from ..targets.base import Distribution, HashesFiles, ImageCapable, Target
from .runlog import RunLog, with_distribution


def prepare(run: RunLog, target: Target, patch: str | None, strip: int | None, *,
            after_load: Callable[[PatchSet], None] | None = None) -> tuple[PatchSet, Distribution, Variant, Diff]:
    """Load the patch set, find the installed distribution, pick the variant and parse its diff
    (`after_load` runs between the first two: the probe may start early there)."""
    with run.step("load patch"):
        patchset = resolve(patch, strip=strip)
    if after_load is not None:
        after_load(patchset)
    with run.step("locate"):
        dist = target.locate(patchset.distribution)
    run.update(target=with_distribution(run.draft.target, dist))
    variant, diff = select_variant(patchset, dist, strip, run)
    return patchset, dist, variant, diff


class CachingReader:
    """Reads each file of the target once (an image read is a get_archive round trip)."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self._cache: dict[str, bytes | None] = {}

    def __call__(self, path: str) -> bytes | None:
        if path not in self._cache:
            self._cache[path] = self._target.read(path)
        return self._cache[path]


def patch_source(patchset: PatchSet, variant: Variant) -> str:
    """The diff's path relative to its patch set's folder (a bare diff: its file name).

    Never the host path it was read from: the report is signed and published, and the same
    patch must give the same `patch` section on every machine and checkout."""
    if patchset.is_bare:
        return variant.diff_path.name
    return variant.diff_path.relative_to(patchset.source.resolve()).as_posix()


def select_variant(patchset: PatchSet, dist: Distribution, strip: int | None, run: RunLog) -> tuple[Variant, Diff]:
    variant = patchset.variants[0] if patchset.is_bare else patchset.variant_for(dist.version)
    run.update(patch=PatchReport(
        id=patchset.id, variant=None if patchset.is_bare else variant.name, sha256=variant.diff_sha256,
        source=patch_source(patchset, variant), hash_checks=not patchset.is_bare,
        review=None if patchset.is_bare else variant.review,
    ))
    if patchset.is_bare:
        run.notes.append("bare diff file: release and hash checks skipped")
    try:
        diff = parse_diff(variant.diff, strip=patchset.strip if strip is None else strip)
    except BadInput as exc:  # the engine parses bytes; name the file they came from
        raise type(exc)(f"{variant.diff_path}: {exc.message}", hint=exc.hint) from None
    check_bounds(diff, variant)
    check_owned(diff, dist)
    if not patchset.is_bare:
        in_diff = {fp.path for fp in diff.files}
        if in_diff != set(variant.files):
            raise InvalidPatchSet(
                f"patch set {patchset.id} variant {variant.name}: the diff touches {sorted(in_diff)} "
                f"but patch.toml lists hashes for {sorted(variant.files)}",
                hint="list every file of the diff under [variants.files]",
            )
    return variant, diff


# What one patch set's diff may hold: a real patch set changes a few files with a few dozen
# hunks; these bounds keep a hostile one from filling the tree or the planner's time.
MAX_FILES = 200
MAX_HUNKS = 5000


def check_bounds(diff: Diff, variant: Variant) -> None:
    hunks = sum(len(fp.hunks) for fp in diff.files)
    if len(diff.files) > MAX_FILES or hunks > MAX_HUNKS:
        raise MalformedPatch(
            f"{variant.diff_path.name}: {len(diff.files)} files and {hunks} hunks; a patch set may change at most "
            f"{MAX_FILES} files with {MAX_HUNKS} hunks",
            hint="split the change into several patch sets, or check that this is the diff you meant",
        )


def owned_folders(dist: Distribution) -> frozenset[str]:
    """The distribution's own top-level folders, by its RECORD: `vllm` for vLLM (not its
    dist-info, its .data, its scripts, nor a top-level module file). Without a RECORD, its
    import name."""
    owned = {top for top in own_folders(e.path for e in dist.record)
             if not top.endswith((".dist-info", ".data", ".egg-info"))}
    return frozenset(owned) or frozenset({dist.name.replace("-", "_").lower()})


def check_owned(diff: Diff, dist: Distribution) -> None:
    """A diff may change only files inside the distribution's own top-level folders: not another
    distribution's files, not its RECORD, not the site folder's top (start-up files and others
    are refused by the diff parser already)."""
    owned = owned_folders(dist)
    for fp in diff.files:
        top, _, rest = fp.path.partition("/")
        if top not in owned or not rest:
            raise UnsafePatch(
                f"{fp.path}: outside {dist.name}'s own folders ({', '.join(sorted(owned))}/) by its RECORD",
                hint=f"a patch set changes only files of {dist.name}; nothing was written",
            )


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
    for fp in plan.files:
        found = sha256_of(target.read(fp.path))
        if found != fp.post_sha256:
            raise CheckFailed(
                f"{fp.path}: after the write it holds {found or 'nothing'}, not the planned post-image "
                f"{fp.post_sha256 or '(deleted)'}",
                hint="two entries of the diff may be one file, or something else writes to the tree; the pre-images were restored",
            )


def compiled_rows(target: Target, dist: Distribution, paths: list[str], *, hint: str | None = None) -> list[dict]:
    """Byte-compile `paths` (relative to the distribution's location) with the target's own
    python: its row for each path, in order. CompileFailed (with `hint`) when it gives no rows,
    naming what it said on stderr, or its exit code when it said nothing."""
    result = target.run_python(inside_source("compile"), [f"{dist.location}/{p}" for p in paths], timeout=300)
    try:
        rows: list[dict] = json.loads(result.stdout.decode("utf-8"))["files"]
    except (ValueError, KeyError):
        said = result.stderr.decode("utf-8", "replace").strip()[-300:] or f"exit {result.returncode}, nothing on stderr"
        raise CompileFailed(f"byte-compiling with {dist.python} failed: {said}", hint=hint) from None
    return rows


def compile_files(target: Target, dist: Distribution, plan: PatchPlan, run: RunLog) -> None:
    paths = [fp.path for fp in plan.files if fp.post is not None and fp.path.endswith(".py")]
    if not paths:
        run.update(compile=CompileReport(ok=True, ran=True))
        return
    rows = compiled_rows(target, dist, paths, hint="the pre-images were restored")
    files = tuple(
        CompiledFile(path=rel, ok=bool(row["ok"]), detail=row["detail"]) for rel, row in zip(paths, rows, strict=True)
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


def check_integrity(target: Target, dist: Distribution, diff: Diff, variant: Variant | None = None,
                    *, pre_image: bool = False) -> IntegrityReport:
    """The distribution against the published wheel (dspark_patch.references), its own RECORD
    against the same, and every .pyc its interpreter would load recompiled and compared
    (inside/integrity.py). The facts are gathered by the target's interpreter, run isolated;
    the verdict is taken here. `pre_image`: the tree before apply writes anything; the files
    the diff changes hold the wheel's own bytes (or, already applied, the post-image) and their
    bytecode is pip's, so it is held to the rule of every other module, not to the tool's."""
    patched = {fp.path for fp in diff.files}
    py_files = [] if pre_image else \
        sorted(fp.path for fp in diff.files if fp.action != "delete" and fp.path.endswith(".py"))
    record = [(e.path, e.sha256) for e in dist.record]
    top = dist.name.replace("-", "_").lower()
    folders = own_folders(p for p, _ in record) | {top}
    folders |= references.folders_of(dist.name, dist.version)
    rows = references.script_rows(record, references.all_scripts(dist.name))
    request = {"location": dist.location, "folders": sorted(folders), "patched": py_files, "scripts": list(rows)}
    doc, files, kept_answer = _integrity_answer(target, dist, request)
    try:
        pth = {str(k): (None if v is None else str(v).encode("latin-1")) for k, v in doc["pth"].items()}
        bytecode = {str(k): str(v) for k, v in doc["bytecode"].items()}
        reused = 0 if kept_answer else int(doc.get("proofs_reused", 0))
        metadata = {str(k): (None if v is None else str(v).encode("latin-1")) for k, v in doc["metadata"].items()}
        scripts = {str(k): _script_bytes(v) for k, v in doc["scripts"].items() if str(k) in rows}
    except (ValueError, KeyError, TypeError, AttributeError, IndexError):
        raise VerifyMismatch(f"the integrity check with {dist.python} answered without its facts") from None
    stale = tuple(f"{pyc} {why}" for pyc, why in sorted(bytecode.items()) if why)
    post: dict[str, set[str | None]] = {}
    if variant is not None:
        post = {path: {expected.post_sha256} for path, expected in variant.files.items()}
    wheel = references.wheel_hash(dist.name, dist.version, files)
    ref = references.find(dist.name, dist.version, wheel)
    if ref is None:
        not_checked = tuple(p for p, _ in record if p.startswith(("/", "../")) or "/../" in p)
        return IntegrityReport(checked=0, not_checked=not_checked, stale_bytecode=stale, reference=None,
                               unverified=(references.no_reference(dist.name, dist.version, wheel),),
                               bytecode_checked=len(bytecode), bytecode_proofs_reused=reused, kept_answer=kept_answer)
    found = references.compare(ref, hashes=files, others=doc.get("others", ()), record=record, post_images=post,
                               top_level=doc.get("top_level", ()), pth=pth, listed_anywhere=doc.get("pth_listed", ()),
                               metadata=metadata, scripts=scripts)
    tag = str(doc.get("cache_tag", ""))
    without = sum(1 for p in files if p.endswith(".py") and _cached_name(p, tag) not in files)
    # Rows outside the tree that were not read: a console script's row with no file there.
    not_checked = tuple(p for p in rows if p not in found.installer and scripts.get(p, b"") is None)
    return IntegrityReport(
        checked=found.checked, mismatched=tuple(p for p in found.unexplained if p not in patched),
        missing=tuple(p for p in found.missing if p not in patched), not_checked=not_checked, stale_bytecode=stale,
        added=found.added, reference=ref.wheel, record_disagrees=found.record_disagrees, bytecode_checked=len(bytecode),
        bytecode_proofs_reused=reused, kept_answer=kept_answer, installer_metadata=found.installer,
        installer_findings=found.installer_findings, modules_without_bytecode=without)


def _cached_name(source: str, tag: str) -> str:
    """a/m.py -> a/__pycache__/m.<tag>.pyc (importlib.util.cache_from_source, for another interpreter)."""
    folder, _, name = source.rpartition("/")
    return f"{folder + '/' if folder else ''}__pycache__/{name[:-3]}.{tag}.pyc"


def _script_bytes(value: Any) -> references.ScriptBytes:
    """inside/integrity.py's answer for one console script: text (latin-1), null, or {"why": …}."""
    if value is None:
        return None
    if isinstance(value, dict):
        return str(value["why"])
    return str(value).encode("latin-1")


def _integrity_answer(target: Target, dist: Distribution,
                      request: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], bool]:
    """inside/integrity.py's answer for `request`, the files' sha256, and whether it is an
    image's answer kept by its id from an earlier check (targets/kept.py says why that is as
    good as asking again).

    The proofs sent (kept from an earlier check by the same interpreter; inside/integrity.py
    says why a kept proof is as good as a compile, targets/proofs.py where they are kept) only
    spare compiles, and who hashed (the walk or the host, `_gathered`) does not change a
    hash, so neither is part of the key."""
    key = target.answer_key(inside_source("integrity"), [request]) if isinstance(target, ImageCapable) else None
    doc: Any = kept.get(key) if key else None
    if _answer_ok(doc):
        return doc, {str(p): str(v[0]) for p, v in doc["files"].items()}, True
    doc, files = _gathered(target, dist, {**request, "proofs": proofs.to_send(target.info, dist)})
    proofs.keep(target.info, dist, doc)
    if key:
        kept_doc = {k: v for k, v in doc.items() if k not in ("proofs", "identity", "files")}
        kept_doc["files"] = {p: [files[p], doc["files"][p][1]] for p in files}
        if _answer_ok(kept_doc):
            kept.keep(key, kept_doc)
    return doc, files, False


def _answer_ok(doc: Any) -> bool:
    """The shape check_integrity reads: files (path -> [sha256, size]), pth, bytecode."""
    try:
        return all(isinstance(v[0], str) for v in doc["files"].values()) \
            and isinstance(doc["pth"], dict) and isinstance(doc["bytecode"], dict) \
            and isinstance(doc["metadata"], dict) and isinstance(doc["scripts"], dict)
    except (KeyError, TypeError, AttributeError, IndexError):
        return False


def _gathered(target: Target, dist: Distribution, request: dict) -> tuple[dict, dict[str, str]]:
    """inside/integrity.py's answer and the files' sha256. On a target that can and runs
    emulated (an image of another architecture: its engine streams the same bytes,
    targets/docker/tree_hashes.py), the host hashes the files
    while the target's python walks them, and takes those hashes only if its archive holds
    exactly the regular files the walk found, each of the size the walk saw; otherwise the walk
    runs again and hashes them itself."""
    native = target if isinstance(target, HashesFiles) and target.emulated else None
    if native is None:
        doc = _run_integrity(target, dist, request)
        return doc, _walk_hashes(doc, dist)
    with ThreadPoolExecutor(max_workers=1) as pool:
        hashing = pool.submit(native.file_hashes, dist.location, request["folders"])
        doc = _run_integrity(target, dist, {**request, "hash": False})
        try:
            hashed = hashing.result()
        except Exception:  # noqa: BLE001 - a stream the engine dropped: the walk hashes instead
            hashed = None
    try:
        walked = {str(p): int(v[1]) for p, v in doc["files"].items()}
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        walked = None
    if hashed is not None and walked is not None and walked.keys() == hashed.keys() \
            and all(hashed[p][1] == size for p, size in walked.items()):
        return doc, {p: hashed[p][0] for p in walked}
    doc = _run_integrity(target, dist, request)
    return doc, _walk_hashes(doc, dist)


def _run_integrity(target: Target, dist: Distribution, request: dict) -> dict:
    result = target.run_python(inside_source("integrity"), [json.dumps(request)], timeout=900)
    try:
        doc = json.loads(result.stdout.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        return doc
    except ValueError:
        raise VerifyMismatch(
            f"the integrity check could not run with {dist.python}: {result.stderr.decode('utf-8', 'replace').strip()[-300:]}"
        ) from None


def _walk_hashes(doc: dict, dist: Distribution) -> dict[str, str]:
    try:
        return {str(p): str(v[0]) for p, v in doc["files"].items()}
    except (KeyError, TypeError, IndexError, AttributeError):
        raise VerifyMismatch(f"the integrity check with {dist.python} answered without its files") from None


def integrity_problems(i: IntegrityReport) -> list[str]:
    """What a check against the published wheel found, one line each (verify's and apply's)."""
    return [*(f"{p}: does not match the published wheel" for p in i.mismatched),
            *(f"{p}: missing (the published wheel has it)" for p in i.missing),
            *(f"{p}: added (not in the published wheel)" for p in i.added),
            *(f"{p}: the RECORD row disagrees with the published wheel" for p in i.record_disagrees),
            *i.installer_findings, *i.stale_bytecode]


def check_base(run: RunLog, target: Target, dist: Distribution, diff: Diff, patchset: PatchSet, variant: Variant,
               *, allow_unknown_base: bool) -> None:
    """apply, before anything is written: the tree must be the published wheel, checked as
    verify checks it (every file against the shipped reference, the RECORD against the same,
    every .pyc the interpreter would load recompiled and compared). The pre-image hashes of the
    patched files say nothing of the others: an edited `vllm/__init__.py` with its RECORD row
    rewritten, an added `.pth` or `sitecustomize.py`, forged bytecode would all be patched and
    then carry the reviewed patch's labels. The early probe warms up meanwhile (EarlyStart).

    A bare diff (no release named) or `--allow-unknown-base`: the findings are notes and the
    tree is patched; a release with no reference: a note (nothing to check against)."""
    with run.step("integrity"):
        i = check_integrity(target, dist, diff, None if patchset.is_bare else variant, pre_image=True)
        if i.reference is None:
            run.notes.extend(f"{u}; patched on the reviewed pre-image hashes alone" for u in i.unverified)
            return
        problems = integrity_problems(i)
        why = "bare diff file" if patchset.is_bare else "--allow-unknown-base" if allow_unknown_base else None
        if why is not None:
            if problems:
                more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
                run.notes.append(f"{why}: the tree is not the published wheel {i.reference}, patched anyway: "
                                 + "; ".join(problems[:3]) + more)
            return
        run.update(integrity=i)
        if problems:
            more = f" (and {len(problems) - 3} more; see the report)" if len(problems) > 3 else ""
            raise ModifiedBase(
                f"{run.draft.target.ref} is not the published wheel {i.reference}: " + "; ".join(problems[:3]) + more
                + "; nothing was written",
                hint="apply to a pristine vLLM install, or rebuild the image from the release; "
                "--allow-unknown-base patches it anyway, and the report says so",
            )


def bytecode_paths(plan: PatchPlan, dist: Distribution) -> list[str]:
    """The cached-bytecode path (relative to location) of every patched module."""
    paths = []
    for fp in plan.files:
        if fp.path.endswith(".py"):
            paths.append(_cached_name(fp.path, dist.cache_tag))
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
