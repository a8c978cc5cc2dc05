"""Steps only an image target has: taking the new layer (exactly the patched files, their
bytecode and folders), the labels, the commit and the push."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol, runtime_checkable

from .. import __version__, unread_env
from ..errors import LayerMismatch, UnimportedCopy, runs_first_message
from ..imageref import ImageRef
from ..patching.plan import FilePlan, PatchPlan
from ..patchset import PatchSet, Variant, available, patched_paths
from ..report.labels import LABEL_PREFIX, SERIES_LABEL, image_labels, series_label
from ..report.model import ImageRecord, LayerChange, LayerReport, PatchReport
from ..targets.base import Distribution, ImageCapable, TargetInfo
from ..targets.caches import proofs
from ..targets.layers import LayersRead, TakenLayer
from ..targets.layers.new_layer import LayerEntry
from ..targets.views.site_folders import minor_version
from .policy import CheckPolicy
from .requests import ImageSpec
from .runlog import ResultCallback, RunLog
from .shared_steps import bytecode_paths

# What the image runs first (refuse_runs_first), waited for when called.
StartedAnswer = Callable[[], "tuple[str, ...]"]


def unimported_copies(target: ImageCapable, dist: Distribution, run: RunLog) -> str | None:
    """A copy of the distribution that no interpreter of the image imports, as one line, or None.

    Not what runs today, but what makes the image's later audits ambiguous: a decoy that a
    reader ranking site folders takes for the answer, a stale install that a changed entrypoint
    or PYTHONPATH would run (docs/status.md: decoy site folder). `apply` refuses such an image, `verify` fails it."""
    with run.step("other copies"):
        others = target.unimported(dist.name)
    if not others:
        return None
    return (f"{', '.join(f'{s}/{dist.name}' for s in others)}: a copy of {dist.name} that no interpreter of the image "
            f"imports (the one that runs is at {dist.location})")


def note_unread_env(target: ImageCapable, dist: Distribution, run: RunLog) -> None:
    """`verify`: a note per variable the image sets that a known patch set introduced and the
    installed release does not read (unread_env.py); never a failure."""
    run.notes.extend(unread_env.notes(unread_env.settings(target.source_config()), available(), target.read,
                                      distribution=dist.name, release=dist.version))


def runs_first(target: ImageCapable, dist: Distribution, run: RunLog) -> list[str]:
    """What the image, started as its config says, runs before or instead of the checked
    distribution (targets/runtime.py: its script folder, working dir, PYTHONPATH, user site,
    start-up hooks), one line each, then what the image's own python, started as the image starts
    it, shows besides (a .pth in another site folder, a finder): `apply` refuses such an image,
    `verify` fails it."""
    with run.step("runtime"):
        found = _config_rules(target, dist)
    with run.step("as started"):
        seen = " ".join(found)
        # A path the config-and-stats model already named is not named twice.
        found += [line for line in target.as_started(dist.name, dist.location) if line.split(":", 1)[0] not in seen]
    return found


def _config_rules(target: ImageCapable, dist: Distribution) -> list[str]:
    """What the config and path stats show the image runs first (targets/runtime.py `runs_first`)."""
    return list(target.runs_first(dist.name, dist.location, minor_version(dist.python_version or "")))


def refuse_runs_first(target: ImageCapable, dist: Distribution, run: RunLog) -> StartedAnswer:
    """`apply`: what the image runs before or instead of the checked distribution (`runs_first`:
    the config-and-files rules, then the image's own python as the image starts it), asked on a
    thread of its own beside the plan, write, compile and probe (it is path stats and one exec of
    the image's python: about a second, off the critical path). What this returns waits for the
    answer; `LayerCheck.join` refuses on it before anything is committed. The work container is
    discarded either way, so nothing of a refused image reaches an image or a tag."""
    box: dict[str, object] = {}

    def ask() -> None:
        try:
            found = _config_rules(target, dist)
            box["found"] = found or list(target.as_started(dist.name, dist.location))
        except BaseException as exc:  # raised in the caller's thread when it waits
            box["error"] = exc

    thread = threading.Thread(target=ask, name="dspark-patch-runtime-check", daemon=True)
    thread.start()

    def answer() -> tuple[str, ...]:
        thread.join()
        if "error" in box:
            raise box["error"]  # type: ignore[misc]
        return tuple(box["found"])  # type: ignore[arg-type]

    return answer


def refuse_started(answer: StartedAnswer, distribution: str, run: RunLog) -> None:
    """Wait for `refuse_runs_first`'s answer and refuse on a finding (nothing is committed)."""
    with run.step("runtime"):
        found = list(answer())
    if found:
        error = runs_first_message(run.draft.target.ref, distribution, found)
        raise type(error)(error.message + "; nothing was committed", hint=error.hint)


def refuse_unimported(target: ImageCapable, dist: Distribution, run: RunLog) -> None:
    """`apply`, before anything is written: an image holding a copy no interpreter imports is refused."""
    found = unimported_copies(target, dist, run)
    if found is not None:
        raise UnimportedCopy(f"{run.draft.target.ref}: {found}; nothing was written",
                             hint="remove that copy from the image, or rebuild the image with one vLLM install")


class LayerCheck:
    """`apply`: the source image's layers through the strict layer reader (docs/status.md: tar differentials),
    started when the distribution is located and joined before the commit (or the tag, or the
    end of a dry run), so that a save overlaps the base check, the write, compile and probe.

    apply works on what the engine unpacked: the filesystem a container of the image sees, read
    through the engine's archive API and the image's own python. An image whose layers the reader
    refuses is hostile (the audit of its result through its layers would be an error row): it is
    refused, nothing committed or tagged. The layers are read from the scan cache (kept by the
    predicate `status` keeps by, so both share it) whenever it holds all of them; otherwise only
    with `strict` (`apply --strict-layers`), since reading them is a save of the whole image and
    a cold apply on a serving image of 10-30 GB would be that save (docs/status.md, "Why both").
    Without it the layers are not read, and a note says so.

    `started`: what the image runs first (refuse_runs_first), asked beside the same steps and
    joined first: a finding there is refused the same way."""

    def __init__(self, target: ImageCapable, distribution: str, *, strict: bool = False,
                 started: StartedAnswer | None = None) -> None:
        # The strict layer reader loads here, for an image, not with every local command.
        from ..targets.caches.scans import ScanCache
        from ..targets.views.from_layers import status_retain_identity

        self._target, self._distribution = target, distribution
        self._as_started = started   # the image's python as it starts (refuse_runs_first), joined here too
        self._retain = patched_paths(available())
        self._cache = ScanCache.from_env(status_retain_identity(distribution, self._retain))
        self._strict = strict
        self._read: LayersRead | None = None
        self._error: BaseException | None = None
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._seconds = 0.0
        self._thread = threading.Thread(target=self._check, name="dspark-patch-layer-check", daemon=True)
        self._thread.start()

    def _check(self) -> None:
        try:
            self._read = self._target.check_layers(self._distribution, self._retain, self._cache, save=self._strict,
                                                   stop=self._stop)
        except BaseException as exc:  # raised in the caller's thread by join()
            self._error = exc
        finally:
            self._seconds = time.monotonic() - self._started

    def cancel(self) -> None:
        """The run ended otherwise (refused, failed): stop a save under way (it ends at its next
        chunk). Waited for briefly only: dockerd 20.10 sends the first byte of a save only once
        it has exported the image (about 10 s for the fixture), and a refusal should not wait
        for that; the thread is a daemon and ends with the process."""
        self._stop.set()
        self._thread.join(timeout=2.0)

    def cache_new_layer(self) -> None:
        """After the commit: the new layer's scan into the same cache, so that `status` (or an
        apply) of the result reads none of its layers again, the new one included."""
        self._target.cache_layer_scan(self._distribution, self._retain, self._cache)

    def join(self, run: RunLog) -> None:
        if self._as_started is not None:
            refuse_started(self._as_started, self._distribution, run)
        with run.step("layers"):
            self._thread.join()
            if self._error is not None:
                raise self._error
        read = self._read
        if read is not None and read.how == "saved":   # else from the scan cache (well under a second), or not read
            run.notes.append(f"the image's layers were read with the strict layer reader: a save of the image, "
                             f"{self._seconds:.1f} s beside the other steps (kept in the scan cache by diff_id)")
        elif read is not None and read.how == "not-read":
            run.notes.append(f"the image's layers were not read with the strict layer reader ({read.not_cached} of "
                             f"{read.layers} not in the scan cache; reading them is a save of the whole image): what "
                             "was checked is the filesystem a container of the image sees; --strict-layers reads "
                             "them, as `status --via layers` does")


class TakesLayer(Protocol):
    """A target the new layer is taken from: an image's work container, or a local tree whose
    layer `apply --root --layer-out` writes (LayerWriter)."""

    def take_layer(self, paths: Sequence[str], deleted: Sequence[str] = ()) -> TakenLayer: ...


@runtime_checkable
class LayerWriter(TakesLayer, Protocol):
    def write_layer(self, path: str) -> None: ...


def take_layer(target: TakesLayer, dist: Distribution, plan: PatchPlan, pyc_before: dict[str, bytes | None],
               run: RunLog) -> None:
    """Take the new layer from the target: the planned files, their bytecode and folders.

    The layer is made of exactly those paths, so nothing else can be in it; what is checked
    here is that the planned files hold the planned bytes."""
    with run.step("layer"):
        kept = [fp for fp in plan.files if fp.post is not None]
        gone = [fp for fp in plan.files if fp.post is None]
        compiled = run.draft.compile.ran
        bytecode = [pyc for pyc in bytecode_paths(_only(plan, kept), dist) if compiled]
        # A deleted module's bytecode goes with it (a whiteout for a path the image lacks is harmless).
        deleted = [fp.path for fp in gone] + bytecode_paths(_only(plan, gone), dist)
        layer = target.take_layer([fp.path for fp in kept] + bytecode, deleted)
        changes, unexpected = layer_changes(plan, dist, layer.entries, deleted, pyc_before)
        run.update(layer=LayerReport(ok=not unexpected, changes=changes, unexpected=unexpected,
                                     diff_id=layer.diff_id, size=layer.size))
        if unexpected:
            shown = ", ".join(f"{c.kind} {c.path}" for c in unexpected[:5])
            raise LayerMismatch(
                f"the new layer would differ from the patched files: {shown}",
                hint="nothing was committed; report this as a bug with the audit report",
            )


def layer_changes(plan: PatchPlan, dist: Distribution, entries: Sequence[LayerEntry], deleted: Sequence[str],
                  pyc_before: dict[str, bytes | None]) -> tuple[tuple[LayerChange, ...], tuple[LayerChange, ...]]:
    """The layer's changes as the report lists them, and those the plan does not explain."""
    new = {f"{dist.location}/{fp.path}" for fp in plan.files if fp.pre is None}
    new |= {f"{dist.location}/{pyc}" for pyc, old in pyc_before.items() if old is None}
    # A file is "A" when the image had none there; folders are listed as "C" (they are in
    # the layer as the image has them, owner and mode kept).
    changes = tuple(LayerChange(kind="D" if e.deleted else "A" if e.path in new else "C", path=e.path)
                    for e in entries)
    planned = {f"{dist.location}/{fp.path}": fp.post_sha256 for fp in plan.files if fp.post is not None}
    expected = expected_layer(plan, dist)
    # A whiteout only for a file the plan deletes (or its bytecode): one of a folder above a
    # patched file (the whole dist-packages) would hide far more than the patch (docs/status.md: the new layer's check).
    removals = {f"{dist.location}/{path}" for path in deleted}
    unexpected = tuple(c for c, e in zip(changes, entries, strict=True)
                       if c.path not in expected or (c.path in planned and e.sha256 != planned[c.path])
                       or (e.deleted and c.path not in removals) or (not e.deleted and c.path in removals))
    return changes, unexpected


def commit_image(spec: ImageSpec, target: ImageCapable, plan: PatchPlan, patchset: PatchSet, variant: Variant, run: RunLog,
                 *, dist: Distribution, on_result: ResultCallback | None = None) -> None:
    """The result image, then its reports, then its name, then the push: a run that cannot write
    its reports, or whose tag another run took meanwhile, names nothing and leaves no image."""
    labels = labels_for(patchset, variant, plan, run)
    run.update(labels=dict(sorted(labels.items())))
    with run.step("commit"):
        committed = target.commit(labels=labels)
    try:
        run.update(result_image=ImageRecord(ref=spec.tag or committed.ref, id=committed.id))
        # the new layer holds vLLM's files only: the result's interpreter is the source's
        proofs.carry(target.info, TargetInfo(kind="image", ref=committed.ref, id=committed.id), dist)
        if spec.tag:
            if on_result is not None:
                on_result(run.report("applied"))
            with run.step("tag"):
                target.name(spec.tag, force=spec.force)
    except BaseException:
        run.update(result_image=None)
        removed = target.discard()
        if removed is not None:
            run.notes.append(f"removed the image {removed} this run made: it was not named")
        raise
    if spec.push and spec.tag:
        try:
            with run.step("push"):
                digest = target.push(spec.tag)
        except BaseException:
            run.update(result_image=None)  # the target removed the tag again: there is no result
            raise
        repository = ImageRef.parse(spec.tag).name
        run.update(result_image=ImageRecord(ref=spec.tag, id=committed.id, repo_digest=f"{repository}@{digest}"))
        run.notes.append(f"pushed {spec.tag} as {repository}@{digest}")


def name_source(spec: ImageSpec, target: ImageCapable, run: RunLog, on_result: ResultCallback | None) -> None:
    """An image that already carries the patch: like a cached `docker build`, the name the caller
    asked for points at it (reports first, then the name, under the tag's lock)."""
    assert spec.tag
    info = target.info
    run.update(result_image=ImageRecord(ref=spec.tag, id=info.id or ""))
    run.notes.append(f"tagged the source image as {spec.tag}; no new layer")
    try:
        if on_result is not None:
            on_result(run.report("already-applied"))
        with run.step("tag"):
            target.tag_source(spec.tag, force=spec.force)
    except BaseException:
        run.update(result_image=None)
        run.notes.pop()
        raise


def label_ids(label: str) -> tuple[str, ...] | None:
    """The ids a series label names, in order, as written; None when it is not such a list (a
    label is input)."""
    try:
        return tuple(str(m["id"]) for m in json.loads(label))
    except (ValueError, TypeError, KeyError):
        return None


def series_ids(label: str) -> str:
    """The ids a series label names, for a message (anything else is said as such)."""
    ids = label_ids(label)
    return "a malformed series label" if ids is None else " + ".join(ids)[:200]


def _only(plan: PatchPlan, files: list[FilePlan]) -> PatchPlan:
    return replace(plan, files=tuple(files))


def expected_layer(plan: PatchPlan, dist: Distribution) -> set[str]:
    paths = {f"{dist.location}/{pyc}" for pyc in bytecode_paths(plan, dist)}
    for fp in plan.files:
        full = f"{dist.location}/{fp.path}"
        paths.add(full)
        if fp.path.endswith(".py"):  # its bytecode's folder: written, or holding a deletion
            folder = full.rpartition("/")[0]
            paths.add(f"{folder}/__pycache__")
        # every folder above a file is in the layer (as a commit of a container would have it)
        parts = full.split("/")
        for i in range(2, len(parts)):
            paths.add("/".join(parts[:i]))
    return paths


def labels_for(patchset: PatchSet, variant: Variant, plan: PatchPlan, run: RunLog) -> dict[str, str]:
    return image_labels(run.draft, patch_id=patchset.id or "bare-diff", variant=variant.name,
                        diff_sha256=variant.diff_sha256, files={fp.path: fp.post_sha256 for fp in plan.files},
                        tool_version=__version__)


def check_labels(target: ImageCapable, variant: Variant, patchset: PatchSet, policy: CheckPolicy,
                 series: tuple[PatchReport, ...] = ()) -> list[str]:
    """`series`: the members verify was asked for (a series of several), whose label must say
    exactly them; a single patch set's image has no series label."""
    labels = target.source_labels()
    problems = []
    files_label = labels.get(f"{LABEL_PREFIX}.files")
    if files_label is None:
        return [f"the image has no {LABEL_PREFIX}.* labels (it was not made by dspark-patch apply)"]
    carried = labels.get(SERIES_LABEL)
    if series and carried != series_label(series):
        problems.append(f"label {SERIES_LABEL} does not name the series {', '.join(m.id or '' for m in series)}")
    elif not series and carried is not None:
        problems.append(f"the image was made from a series ({series_ids(carried)}), not from {patchset.id or 'this diff'} alone")
    if labels.get(f"{LABEL_PREFIX}.patch.id") != (patchset.id or "bare-diff"):
        problems.append(f"label {LABEL_PREFIX}.patch.id is {labels.get(f'{LABEL_PREFIX}.patch.id')!r}")
    if labels.get(f"{LABEL_PREFIX}.patch.sha256") != variant.diff_sha256:
        problems.append(f"label {LABEL_PREFIX}.patch.sha256 does not match the diff")
    try:
        files = json.loads(files_label)
    except ValueError:
        return problems + [f"label {LABEL_PREFIX}.files is not JSON"]
    if policy.release_checks:
        want = {p: h.post_sha256 for p, h in variant.files.items()}
        if files != want:
            problems.append(f"label {LABEL_PREFIX}.files does not list the reviewed post-image hashes")
    return problems
