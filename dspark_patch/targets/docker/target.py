"""A container image as a patch target (`--image REF`): the Target protocol and the image-only
operations (`ImageCapable`), built on one `WorkContainer` of the image.

Opening it checks the image, collects containers a killed run left behind, and starts a
keep-alive container run by the image's own python; files are read and written through the
engine's archive API and python runs per exec. That container is never committed: the new
layer is taken from it as a tar of exactly the patched files, their bytecode and folders
(`take_layer`), and the image is built from the source plus that tar (result_image.py, append.py).

What is not the container itself lives in helpers, each given this target (a `WorkImage`) or
what it holds: locate.py (which python owns the distribution), started.py (the image's python
as the image starts it), layer_check.py (the strict layer reader on the layers) and
result_image.ResultImage (the result, its name, its push).
"""

from __future__ import annotations

import posixpath
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from ...errors import (
    CheckFailed,
    TargetNotFound,
    UnsafePatch,
)
from ...inside import ISOLATED
from ...inside import source as inside_source
from .. import interpreter, runtime
from ..base import (
    HANDSHAKE_PREFIX,
    CommittedImage,
    Distribution,
    PullCallback,
    PullPolicy,
    RunResult,
    TargetInfo,
)
from ..caches import answers
from ..caches.scans import ScanCache
from ..layers import LayersRead, TakenLayer
from ..layers.new_layer import taken
from . import emulation, layer_check, result_image, started, tree_hashes
from .client import DockerEngine, ImageInfo
from .container import NEW_FILE, ExecutableMissing, FileMeta, RunningCall, WorkContainer
from .locate import ImageLocator
from .reader import ImageReader

if TYPE_CHECKING:
    from ...patching.plan import PatchPlan

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
        self._locator = ImageLocator(self, python=python)  # which python owns the distribution
        self._notes: list[str] = []
        self._layer: bytes | None = None
        self._result_image: result_image.ResultImage | None = None   # what it makes and names, once asked
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
                                 keepalive={"entrypoint": result_image.keepalive_argv(python), "command": None,
                                            "user": "0"})
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
        source = self._source
        return TargetInfo(kind="image", ref=self.ref, id=source.id if source else None,
                          layers=source.diff_ids if source else ())

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
        """The distribution as the interpreter that owns it sees it (locate.py, interpreter.py)."""
        self._dist = self._locator.locate(distribution)
        return self._dist

    def unimported(self, distribution: str) -> tuple[str, ...]:
        """Site folders holding `distribution` that no interpreter of the image imports (locate.py)."""
        return self._locator.unimported(distribution)

    def check_layers(self, distribution: str, retain: Iterable[str], cache: ScanCache, *, save: bool = True,
                     stop: threading.Event | None = None) -> LayersRead:
        """The source's layers through the strict layer reader (layer_check.py)."""
        return layer_check.check_layers(self.engine, self.source, self.ref, distribution, retain, cache,
                                        save=save, stop=stop)

    def cache_layer_scan(self, distribution: str, retain: Iterable[str], cache: ScanCache) -> None:
        """The scan of the layer `commit` added, kept beside the source's (layer_check.py)."""
        layer_check.cache_layer_scan(self._layer, distribution, retain, cache)

    def answer_key(self, source: str, args: Sequence[Any]) -> str | None:
        """The key under which the image's answer to the read-only script `source` run with
        `args` by the distribution's python is kept (targets/caches/answers.py); None once anything was
        written into the work container (its tree is then no longer the image's)."""
        if self._written or self._dist is None:
            return None
        return answers.answer_key(image_id=self.source.id, engine=self.engine.host, script=source,
                               python=self._dist.python, args=list(args))

    def runs_first(self, distribution: str, location: str, python: str | None) -> tuple[str, ...]:
        """What the image, started as its config says, runs before or instead of the
        distribution at `location` (targets/runtime.py), read through path stats: nothing runs."""
        return tuple(runtime.runs_first(self.source.config, self.stat, self.read_small, site=location, python=python,
                                        distribution=distribution))

    def as_started(self, distribution: str, location: str) -> tuple[str, ...]:
        """What the image's own python, started as the image starts it (its USER, WORKDIR, Env,
        the entrypoint's python and flags), imported at start and where it resolves the
        distribution: findings only (targets/runtime.py `judge_started`). Runs the image's
        start-up code, as the probe does, in this container."""
        return started.as_started(self, distribution, location)

    def stat(self, path: str) -> dict[str, Any] | None:
        """The engine's path stat of `path` in the work container (nothing runs)."""
        return self.engine.path_stat(self.container.id, path)

    def read_small(self, path: str) -> bytes | None:
        """A small regular file's bytes from the work container, None otherwise."""
        if not interpreter.is_small_file(self.stat(path)):
            return None
        try:
            found = self.container.copy_out(path)
        except UnsafePatch:
            return None
        return found[0] if found else None

    @property
    def written(self) -> bool:
        """Whether anything was copied into the work container (then no answer is kept)."""
        return self._written

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

    # --- ImageCapable: the layer, then the result (result_image.ResultImage) --------------
    def take_layer(self, paths: Sequence[str], deleted: Sequence[str] = ()) -> TakenLayer:
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
        self._layer = layer_check.fetch_layer(self.container, result.stdout)
        return taken(self._layer)

    def source_labels(self) -> Mapping[str, str]:
        return self.source.config.get("Labels") or {}

    def source_config(self) -> Mapping[str, Any]:
        return self.source.config

    def commit(self, *, labels: Mapping[str, str]) -> CommittedImage:
        """The layer `take_layer` took, on top of the source with the source's config and `labels`
        added, untagged. Nothing stays unless the result is verified (layers, config field by field)."""
        assert self._engine
        if self._layer is None:
            raise RuntimeError("take_layer() must run before commit()")
        return self._made.commit(self._layer, labels=labels)

    def name(self, tag: str, *, force: bool) -> CommittedImage:
        return self._made.name(tag, force=force)

    def discard(self) -> str | None:
        return self._made.discard()

    def push(self, tag: str) -> str:
        return self._made.push(tag)

    def refuse_existing_tag(self, tag: str, *, force: bool) -> None:
        self._made.refuse_existing_tag(tag, force=force)

    def tag_source(self, tag: str, *, force: bool) -> CommittedImage:
        return self._made.tag_source(tag, force=force)

    @property
    def _made(self) -> result_image.ResultImage:
        """What this target makes and names in the engine (result_image.py), from the first use."""
        if self._result_image is None:
            self._result_image = result_image.ResultImage(self.engine, self.source, self._notes)
        return self._result_image

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
