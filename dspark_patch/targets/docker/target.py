"""A container image as a patch target (`--image REF`): the Target protocol and the image-only
operations (`ImageCapable`), built on one `WorkContainer` of the image.

Opening it checks the image, collects containers a killed run left behind, and starts a
keep-alive container run by the image's own python; files are read and written through the
engine's archive API and python runs per exec. That container is never committed: the new
layer is taken from it as a tar of exactly the patched files, their bytecode and folders
(`take_layer`), and the image is built from the source plus that tar (result_image.py, append.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import docker.errors

from ...distname import filename_name
from ...errors import (
    AmbiguousDistribution,
    BadInput,
    CheckFailed,
    DsparkPatchError,
    EnvironmentProblem,
    TagRace,
    TargetNotFound,
    UnsafePatch,
)
from ...inside import ISOLATED
from ...inside import source as inside_source
from .. import image_start, imageconfig, interpreter, kept, runtime
from ..base import (
    HANDSHAKE_PREFIX,
    CommittedImage,
    Distribution,
    LayerEntry,
    PullCallback,
    PullPolicy,
    RecordEntry,
    RunResult,
    TargetInfo,
)
from ..layerfs import merge_scans, status_keep
from ..layers import TarStream
from ..layers.cache import ScanCache
from ..layers.scan import scan_layer
from . import emulation, result_image, tag_lock, tree_hashes
from .client import DockerEngine, ImageInfo
from .container import NEW_FILE, ExecutableMissing, FileMeta, RunningCall, WorkContainer
from .reader import ImageReader
from .save_views import save_layer_where, save_views

if TYPE_CHECKING:
    from ...patching.plan import PatchPlan

_LOCATE_SOURCE = (Path(__file__).parent.parent.parent / "inside" / "locate.py").read_text()
# What locate's and unimported's kept answers (targets/kept.py) are made by, besides the
# interpreter's own script: the code here that stats the image and chooses among its pythons.
_OWN_SOURCE = "".join(
    (Path(__file__).parent.parent / name).read_text() for name in ("docker/target.py", "interpreter.py", "imageconfig.py"))
PYTHONS = ("python3", "python")


class ImageTarget:
    """A container made from `ref`, used as a patch target; use it as a context manager."""

    def __init__(
        self, ref: str, *, engine: DockerEngine | None = None, python: str | None = None,
        pull: PullPolicy = "never", on_pull: PullCallback | None = None,
    ) -> None:
        self.ref = ref
        self._engine = engine
        self._wanted_python = python  # --python: the interpreter to patch with, else discovered
        self._pull = pull
        self._on_pull = on_pull
        self._source: ImageInfo | None = None
        self._work: WorkContainer | None = None
        self._python: str | None = None   # the keep-alive's interpreter (any python will do)
        self._dist: Distribution | None = None
        self._imported: set[str] = set()  # the site folders the located interpreters import from
        self._located: set[str] = set()   # the interpreters locate ran
        self._notes: list[str] = []
        self._layer: bytes | None = None
        self._result: CommittedImage | None = None   # what commit() made, until discard()
        self._written = False             # anything copied into the work container: no answer is kept after
        self._emulated: bool | None = None
        self._stack = ExitStack()

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> ImageTarget:
        if self._source is None:
            self._engine = self._engine or DockerEngine()
            self._source, pulled = self._engine.ensure_image(self.ref, pull=self._pull, on_progress=self._on_pull)
            if pulled:
                self._notes.append(f"pulled {self.ref} ({self._source.id[:19]}) from its registry (--pull {self._pull})")
            removed = self._engine.gc_containers()
            if removed:
                self._notes.append(f"removed {len(removed)} container(s) left by an earlier, killed run")
        try:
            self._work = self._start()
            return self
        except BaseException:  # a failed entry is never exited: what it started goes now (SIGTERM too)
            self.__exit__(None, None, None)
            raise

    def __exit__(self, *exc: object) -> None:
        work, self._work = self._work, None
        try:
            self._stack.close()
        finally:
            if work is not None:
                self._notes.extend(work.notes)

    def _start(self) -> WorkContainer:
        """The keep-alive container, run by some python of the image (not a shell: an image may
        have none). Which python owns vLLM is `locate`'s question; this one only keeps it alive."""
        if self._python or self._wanted_python:
            python = self._python or self._wanted_python
            assert python is not None
            work = self._try_start([python])
            if work is None:
                raise TargetNotFound(f"image {self.ref} has no interpreter {python} (--python)",
                                     hint="give --python the path of a python inside the image")
            return work
        work = self._try_start(PYTHONS)  # on PATH: the cheap, common case
        if work is not None:
            return work
        # None on PATH: ask the archive API which of the config's candidates exist.
        with ImageReader(self.ref, engine=self.engine, image_id=self.source.id) as peek:
            paths = interpreter.candidates(self.source.config, peek.stat, lambda _: None)
            found = interpreter.existing(paths, peek.stat)
        work = self._try_start([i.path for i in found])
        if work is None:
            raise TargetNotFound(
                f"image {self.ref} has no python3 or python (looked on its PATH and at {', '.join(paths[:6])}, …)",
                hint="the tool runs the image's own interpreter; patch an image that has python",
            )
        return work

    def _try_start(self, pythons: Sequence[str]) -> WorkContainer | None:
        for python in pythons:
            work = WorkContainer(self.engine, self.source.id, ref=self.ref, python=python,
                                 keepalive={"entrypoint": result_image.keepalive_argv(python), "command": None})
            # Its exit is on the stack before its entry: a SIGTERM just after the entry (before
            # `enter_context` would have pushed it) must still remove the container. Exiting one
            # whose entry failed does nothing.
            self._stack.push(work)
            try:
                entered = work.__enter__()
            except ExecutableMissing:
                continue
            self._python = python
            return entered
        return None

    @property
    def container(self) -> WorkContainer:
        if self._work is None:
            raise RuntimeError("ImageTarget used outside its with-block")
        return self._work

    @property
    def info(self) -> TargetInfo:
        return TargetInfo(kind="image", ref=self.ref, id=self._source.id if self._source else None)

    @property
    def source(self) -> ImageInfo:
        if self._source is None:
            raise RuntimeError("ImageTarget used outside its with-block")
        return self._source

    @property
    def notes(self) -> tuple[str, ...]:
        return tuple(self._notes)

    # --- Target protocol ----------------------------------------------------------------
    def locate(self, distribution: str) -> Distribution:
        """The distribution as the interpreter that owns it sees it (see interpreter.py)."""
        key = self._own_key("locate", distribution)
        answer = kept.get(key) if key else None
        try:
            results = [interpreter.Located(interpreter=interpreter.Interpreter(**row["interpreter"]), found=row["found"])
                       for row in answer] if isinstance(answer, list) else None
        except (TypeError, KeyError):
            results = None
        failures: list[CheckFailed] = []
        if results is None:
            if self._wanted_python:
                pythons = [interpreter.Interpreter(path=self._wanted_python, binary=self._wanted_python, venv=None)]
            else:
                pythons = self._interpreters()
            results = []
            for python in pythons:
                try:
                    results.append(interpreter.Located(interpreter=python, found=self._locate_with(python.path, distribution)))
                except CheckFailed as exc:  # one broken python (say, a python2) need not hide the others
                    failures.append(exc)
            if key and not failures:
                kept.keep(key, [{"interpreter": {"path": r.interpreter.path, "binary": r.interpreter.binary,
                                                 "venv": r.interpreter.venv}, "found": dict(r.found)} for r in results])
        self._note_imported(results)
        if failures and not any(r.found["found"] for r in results):
            raise failures[0]
        found = interpreter.choose(self.ref, distribution, results).found
        if found["package_dir"] and posixpath.dirname(found["package_dir"]) != found["location"]:
            raise BadInput(
                f"in image {self.ref}, `import {distribution}` would load {found['package_dir']}, "
                f"not the installed distribution at {found['location']}",
                hint="remove the shadowing copy from the image's sys.path",
            )
        if found.get("duplicates"):
            raise AmbiguousDistribution(
                f"in image {self.ref}, {found['python']} sees {len(found['duplicates'])} {distribution} distributions: "
                + ", ".join(found["duplicates"]),
                hint="an installer leaves exactly one dist-info per distribution; which one is in use is not decidable")
        if found.get("record_error"):
            raise BadInput(f"in image {self.ref}, the RECORD of {distribution} at {found['location']}: {found['record_error']}",
                           hint="the RECORD is malformed; rebuild the image from the release")
        self._dist = Distribution(
            name=found["name"],
            version=found["version"],
            location=found["location"],
            python=found["python"],
            python_version=found["python_version"],
            cache_tag=found["cache_tag"],
            record_file=found["record_file"],
            record=tuple(RecordEntry(path=p, sha256=h, size=s) for p, h, s in found["record"]),
        )
        return self._dist

    def unimported(self, distribution: str) -> tuple[str, ...]:
        """The site folders at the usual places (imageconfig.site_candidates, the ones `status`
        lists as `unimported`) that hold `distribution`'s package but that no interpreter of the
        image imports it from: a decoy beside the copy that runs, or a stale second install.
        Stats only, after `locate`; with --python the image's other interpreters are asked too
        (a copy some interpreter imports is no decoy)."""
        key = self._own_key("unimported", distribution, sorted(self._imported), sorted(self._located))
        answer = kept.get(key) if key else None
        if isinstance(answer, list) and all(isinstance(a, str) for a in answer):
            return tuple(answer)
        left = self._unimported(distribution)
        if key:
            kept.keep(key, list(left))
        return left

    def _unimported(self, distribution: str) -> tuple[str, ...]:
        top = filename_name(distribution)
        stat = self._stat
        sites = imageconfig.site_candidates(self.source.config, lambda p: imageconfig.is_dir(stat(p)))
        holding = [s for s in sites if stat(f"{s}/{top}/__init__.py") is not None]
        left = [s for s in holding if posixpath.normpath(s) not in self._imported]
        if left:
            others = [p for p in self._interpreters() if p.path not in self._located]
            results = []
            for python in others:
                try:
                    results.append(interpreter.Located(interpreter=python, found=self._locate_with(python.path, distribution)))
                except CheckFailed:
                    continue  # a python that does not run imports nothing
            self._note_imported(results)
            left = [s for s in left if posixpath.normpath(s) not in self._imported]
        return tuple(left)

    def check_layers(self, distribution: str, keep: Iterable[str], cache: ScanCache, *,
                     stop: threading.Event | None = None) -> bool:
        """Read the source image's layers with the strict layer reader, as `status --via layers`
        does, and raise what it refuses (a header two tar readers read differently, an unclean
        name, a link over a folder, a cap): apply works on what the engine unpacked, but an image
        whose layers the reader refuses is hostile, and the audit of its result would be an
        error row. A layer whose scan `cache` holds (by diff_id) is not read again, so an image
        whose every layer is cached costs no save; returns whether a save was needed. Setting
        `stop` ends a save under way (EnvironmentProblem)."""
        diff_ids = self.source.diff_ids
        scans = [cache.get(d) for d in diff_ids]
        if diff_ids and all(s is not None for s in scans):
            found: object = merge_scans([s for s in scans if s is not None], where=f"image {self.ref}")
            saved = False
        else:
            found = save_views(self.engine, [self.source.id], distribution, keep, cache, stop=stop).get(self.source.id)
            saved = True
        if found is None:
            raise EnvironmentProblem(f"the engine's save of image {self.ref} did not hold all of its layers")
        if isinstance(found, DsparkPatchError):
            raise type(found)(f"image {self.ref}: {found.message}; nothing was written",
                              hint=found.hint or "the engine and this tool could unpack this image differently; "
                              "rebuild it from trusted layers")
        return saved

    def keep_layer_scan(self, distribution: str, keep: Iterable[str], cache: ScanCache) -> None:
        """The scan of the layer `commit` added, into `cache` by its diff_id (the sha256 of these
        very bytes, which the engine checked on load), named as a save would name it: a status of
        the result then saves nothing (the source's layers are there from `check_layers`). A
        layer the reader refuses is not kept: a later read says so itself."""
        if self._layer is None:
            return
        digest = "sha256:" + hashlib.sha256(self._layer).hexdigest()
        try:
            scan = scan_layer(io.BytesIO(self._layer), where=save_layer_where(digest), keep=status_keep(distribution, keep))
        except DsparkPatchError:
            return
        cache.put(digest, scan)

    def answer_key(self, source: str, args: Sequence[Any]) -> str | None:
        """The key under which the image's answer to the read-only script `source` run with
        `args` by the distribution's python is kept (targets/kept.py); None once anything was
        written into the work container (its tree is then no longer the image's)."""
        if self._written or self._dist is None:
            return None
        return kept.answer_key(image_id=self.source.id, engine=self.engine.host, script=source,
                               python=self._dist.python, args=list(args))

    def _own_key(self, what: str, *args: Any) -> str | None:
        if self._written:
            return None
        return kept.answer_key(image_id=self.source.id, engine=self.engine.host, script=_OWN_SOURCE + _LOCATE_SOURCE,
                               python=self._wanted_python or "", args=[what, *args])

    def _note_imported(self, results: Sequence[interpreter.Located]) -> None:
        self._located |= {r.interpreter.path for r in results}
        self._imported |= {posixpath.normpath(str(r.found["location"])) for r in results
                           if r.found.get("found") and r.found.get("location")}

    def runs_first(self, distribution: str, location: str, python: str | None) -> tuple[str, ...]:
        """What the image, started as its config says, runs before or instead of the
        distribution at `location` (targets/runtime.py), read through path stats: nothing runs."""
        return tuple(runtime.runs_first(self.source.config, self._stat, self._read_small, site=location, python=python,
                                        distribution=distribution))

    def as_started(self, distribution: str, location: str) -> tuple[str, ...]:
        """What the image's own python, started as the image starts it (its USER, WORKDIR, Env,
        the entrypoint's python and flags), imported at start and where it resolves the
        distribution: findings only (targets/runtime.py `judge_started`). Runs the image's
        start-up code, as the probe does, in this container."""
        top = distribution.replace("-", "_").lower()
        config = self.source.config
        start = image_start.start_of(config, self._stat, self._read_small, what=f"{location}/{top}")
        argv = image_start.started_argv(start, top=top, source=inside_source("started"))
        if argv is None:
            return ()  # not a python the tool follows: `runs_first` names it as not verified
        user = str(config.get("User") or "0")
        workdir = str(config.get("WorkingDir") or "/")
        assigned = {k: v for k, v in start.env.items() if imageconfig.image_env(config).get(k) != v}
        result = self.container.call(argv, env=assigned, timeout=120 if self.emulated else 60, user=user,
                                     workdir=workdir)
        try:
            answer = json.loads(result.stdout[: 1 << 20]) if result.returncode == 0 else None
        except ValueError:
            answer = None
        if answer is None:
            said = (result.stderr.decode(errors="replace").strip().splitlines() or [f"exit {result.returncode}"])[-1]
            return (f"the image's python as the image starts it ({argv[0]} as user {user} in {workdir}) failed: "
                    f"{said[-200:]}; what it runs before {location}/{top} is not verified",)
        return tuple(runtime.judge_started(answer, site=location, top=top))

    def _stat(self, path: str) -> dict[str, Any] | None:
        """The engine's path stat of `path` in the work container (nothing runs)."""
        return self.engine.path_stat(self.container.id, path)

    def _read_small(self, path: str) -> bytes | None:
        """A small regular file's bytes from the work container, None otherwise."""
        if not interpreter.is_small_file(self._stat(path)):
            return None
        try:
            found = self.container.copy_out(path)
        except UnsafePatch:
            return None
        return found[0] if found else None

    def _interpreters(self) -> list[interpreter.Interpreter]:
        """The image's distinct python environments, entrypoint's first (stats only; nothing runs)."""
        def read_head(path: str) -> bytes | None:
            data = self._read_small(path)
            return data[:512] if data is not None else None

        stat = self._stat
        found = interpreter.existing(interpreter.candidates(self.source.config, stat, read_head), stat)
        return found or [interpreter.Interpreter(path=self.container.python, binary=self.container.python, venv=None)]

    def _locate_with(self, python: str, distribution: str) -> dict[str, Any]:
        result = self.container.call([python, *ISOLATED, "-c", _LOCATE_SOURCE, distribution], timeout=120)
        if result.returncode != 0:
            raise CheckFailed(
                f"locating {distribution} in image {self.ref} with {python} failed "
                f"(exit {result.returncode}): {result.stderr.decode(errors='replace').strip()[-500:]}"
            )
        found: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
        return found

    @property
    def engine(self) -> DockerEngine:
        if self._engine is None:
            raise RuntimeError("ImageTarget used outside its with-block")
        return self._engine

    def read(self, path: str) -> bytes | None:
        found = self.container.copy_out(self._absolute(path))
        return None if found is None else found[0]

    def write(self, plan: PatchPlan) -> None:
        self._written = True
        written: list[tuple[str, bytes | None, FileMeta | None]] = []  # (abs path, pre, meta)
        paths = [self._absolute(file.path) for file in plan.files]
        # Each file's bytes and owner/mode as they are now, asked for all at once.
        with ThreadPoolExecutor(max_workers=min(8, max(1, len(paths))), thread_name_prefix="dspark-patch-read") as pool:
            currents = list(pool.map(self.container.copy_out, paths))
        try:
            # Files that exist and stay: one archive for them all (their folders exist).
            replaced = [(path, file.post, current) for path, file, current in zip(paths, plan.files, currents, strict=True)
                        if file.post is not None and current is not None]
            if replaced:
                self.container.copy_many([(path, post, current[1]) for path, post, current in replaced])
                written += [(path, current[0], current[1]) for path, _, current in replaced]
            for path, file, current in zip(paths, plan.files, currents, strict=True):
                if file.post is not None and current is not None:
                    continue
                if file.post is None:
                    self.container.delete(path)
                else:
                    self.container.copy_into(path, file.post, NEW_FILE)
                written.append((path, current[0] if current else None, current[1] if current else None))
        except BaseException:
            for absolute, pre, meta in reversed(written):
                self._put_back(absolute, pre, meta)
            raise

    def restore(self, plan: PatchPlan) -> None:
        self._written = True
        for file in plan.files:
            absolute = self._absolute(file.path)
            current = self.container.copy_out(absolute)
            self._put_back(absolute, file.pre, current[1] if current else None)

    def run_python(
        self,
        source: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 600.0,
    ) -> RunResult:
        python = self._dist.python if self._dist else self.container.python
        return self.container.call([python, *ISOLATED, "-c", source, *args], env=env, timeout=timeout)

    def start_python(
        self, source: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None, timeout: float = 600.0,
    ) -> RunningCall:
        """`run_python`, returning at once (a probe started early, probe/prestart.py)."""
        python = self._dist.python if self._dist else self.container.python
        return self.container.start([python, "-B", "-c", source, *args], env=env, timeout=timeout)

    def put_handshake(self, name: str, data: bytes) -> None:
        """Write `/NAME` (a go-ahead for a process started early), outside every site folder.
        The layer is taken of named paths only, so this file never reaches the image."""
        if "/" in name or not name.startswith(HANDSHAKE_PREFIX):
            raise ValueError(f"not a handshake file name: {name!r}")
        self._written = True
        self.container.copy_into(f"/{name}", data, NEW_FILE)

    @property
    def emulated(self) -> bool:
        """Whether the image is of another architecture than the engine's host (qemu runs it)."""
        if self._emulated is None:
            self._emulated = self.source.architecture not in ("", emulation.engine_platform(self.engine)[1])
        return self._emulated

    def file_hashes(self, location: str, folders: Sequence[str]) -> Mapping[str, tuple[str, int]] | None:
        """The sha256 of every regular file under `folders` of `location`, hashed here from the
        engine's archive of the work container (tree_hashes.py says why that is the same bytes)."""
        return tree_hashes.folder_hashes(self.container.container.client.api, self.container.id, location, folders)

    # --- ImageCapable ---------------------------------------------------------------------
    def take_layer(self, paths: Sequence[str], deleted: Sequence[str] = ()) -> tuple[LayerEntry, ...]:
        """The new layer, taken from the work container now: the files `paths` (relative to the
        distribution's location) and every folder above them, as a tar the image's own python
        writes (owner, mode, mtime as they are here). Only this tar reaches the image."""
        absolute = [self._absolute(p) for p in paths]
        for path in deleted:
            absolute += ["--delete", self._absolute(path)]
        result = self.run_python(inside_source("layer"), absolute, timeout=300)
        if result.returncode != 0:
            # The last line of the image python's stderr (its error, not its traceback).
            said = (result.stderr.decode(errors="replace").strip().splitlines() or [f"exit {result.returncode}"])[-1]
            raise CheckFailed(f"taking the new layer from the container failed: {said[-300:]}",
                              hint="nothing was committed; the image's python did not write the layer of the patched files")
        self._layer = result.stdout
        return layer_entries(self._layer)

    def source_labels(self) -> Mapping[str, str]:
        return self.source.config.get("Labels") or {}

    def commit(self, *, labels: Mapping[str, str]) -> CommittedImage:
        """The layer `take_layer` took, on top of the source with the source's config and `labels`
        added, untagged. Nothing stays unless the result is verified (layers, config field by field)."""
        assert self._engine
        if self._layer is None:
            raise RuntimeError("take_layer() must run before commit()")
        self._result = result_image.build_result(self._engine, self.source, self._layer, labels=labels)
        return self._result

    def name(self, tag: str, *, force: bool) -> CommittedImage:
        """Tag the committed result, last, under the engine's lock on the tag (tag_lock.py)."""
        assert self._engine and self._result is not None
        tag_lock.name_image(self._engine, self._result.id, tag, force=force)
        self._result = replace(self._result, ref=tag)
        return self._result

    def discard(self) -> str | None:
        """The run failed after the commit: its result goes (this run's tag first, if it set one
        and the tag still names the result; another name keeps the image, as `docker rmi` would)."""
        assert self._engine
        result, self._result = self._result, None
        if result is None:
            return None
        if result.ref != result.id and self._engine.tag_exists(result.ref) \
                and self._engine.image_info(result.ref).id == result.id:
            self._engine.untag(result.ref)
        try:
            self._engine.remove_image(result.id)
        except docker.errors.APIError:
            self._notes.append(f"the image {result.id} this run made stays: another name or container refers to it")
            return None
        return result.id

    def push(self, tag: str) -> str:
        """Push a tag (e.g. the committed result) to its registry; returns the manifest digest,
        read back from the registry: registries have no conditional put, so a digest that differs
        there is another push that moved the tag meanwhile (TagRace).

        A failed push leaves no name behind: the tag is removed, and with it the committed image
        unless another name refers to it (the engine's own rule for `docker rmi TAG`)."""
        assert self._engine
        try:
            digest = self._engine.push(tag)
            there = self._engine.registry_digest(tag)
            if there is None:
                self._notes.append(f"the registry's digest of {tag} could not be read back after the push")
            elif there != digest:
                raise TagRace(f"the registry's {tag} names {there}, not the {digest} this run pushed: "
                              "another push moved the tag meanwhile",
                              hint="find which run pushed last; push again, or choose another --tag")
            return digest
        except BaseException:
            try:
                image_id = self._engine.untag(tag)
                kept = image_id is not None and self._engine.tag_exists(image_id)
                self._notes.append(f"the push failed, so the tag {tag} was removed again; the image {image_id} "
                                   + ("stays: another name or container refers to it" if kept else "went with it"))
            except DsparkPatchError as exc:  # the push's own error says more; this one goes into the notes
                self._notes.append(exc.line())
            raise

    def refuse_existing_tag(self, tag: str, *, force: bool) -> None:
        """Fail early, before any work, when `tag` exists and may not be moved."""
        assert self._engine
        tag_lock.refuse_taken(self._engine, tag, force=force)

    def tag_source(self, tag: str, *, force: bool) -> CommittedImage:
        """Name the source image itself (it already carries the patch): no new layer."""
        assert self._engine
        tag_lock.name_image(self._engine, self.source.id, tag, force=force)
        return CommittedImage(ref=tag, id=self.source.id, layers=self.source.layers)

    # --- internals ----------------------------------------------------------------------
    def _absolute(self, path: str) -> str:
        if self._dist is None:
            raise RuntimeError("locate() must run before reading or writing files")
        joined = posixpath.normpath(posixpath.join(self._dist.location, path))
        if posixpath.isabs(path) or not joined.startswith(self._dist.location.rstrip("/") + "/"):
            raise UnsafePatch(f"{path} leaves the distribution's folder {self._dist.location}")
        return joined

    def _put_back(self, absolute: str, pre: bytes | None, meta: FileMeta | None) -> None:
        if pre is None:
            if self.container.exists(absolute):
                self.container.delete(absolute)
        else:
            self.container.copy_into(absolute, pre, meta or NEW_FILE)


def layer_entries(layer: bytes) -> tuple[LayerEntry, ...]:
    """What a layer tar holds: each entry's path (absolute), kind and, for a file, its sha256.

    Read with the strict layer reader (targets/layers): a header the engine could read otherwise
    than we do, a path twice, an opaque folder, a link or a device is refused, never taken."""
    entries = []
    seen: set[str] = set()
    stream = TarStream(io.BytesIO(layer), where="the new layer")
    for member in stream:
        if not member.name:
            continue
        if member.name in seen:
            raise stream.refuse("a path twice in the new layer")
        seen.add(member.name)
        folder_name, _, base = member.name.rpartition("/")
        if base == ".wh..wh..opq" or base.startswith(".wh..wh."):
            raise CheckFailed(f"the new layer makes /{folder_name} opaque (it would hide the folder's lower contents)")
        if member.kind == "file" and base.startswith(".wh."):
            entries.append(LayerEntry(path=f"/{folder_name}/{base[4:]}" if folder_name else f"/{base[4:]}",
                                      folder=False, sha256=None, deleted=True))
            continue
        if member.kind not in ("file", "dir"):
            raise CheckFailed(f"the new layer holds {member.name}, which is neither a file nor a folder")
        digest = None
        if member.kind == "file":
            h = hashlib.sha256()
            for chunk in stream.chunks():
                h.update(chunk)
            digest = h.hexdigest()
        entries.append(LayerEntry(path="/" + member.name, folder=member.kind == "dir", sha256=digest))
    return tuple(entries)
