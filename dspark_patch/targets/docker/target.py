"""A container image as a patch target (`--image REF`): the Target protocol and the image-only
operations (`ImageCapable`), built on one `WorkContainer` of the image.

Opening it checks the image, collects containers a killed run left behind, and starts a
keep-alive container run by the image's own python; files are read and written through the
engine's archive API and python runs per exec. That container is never committed: the new
layer is taken from it as a tar of exactly the patched files, their bytecode and folders
(`take_layer`), and the image is built from the source plus that tar (commit.py, append.py).
"""

from __future__ import annotations

import hashlib
import io
import json
import posixpath
import tarfile
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import BadInput, CheckFailed, TargetNotFound, UnsafePatch
from ...inside import source as inside_source
from ..base import CommittedImage, Distribution, LayerEntry, RecordEntry, RunResult, TargetInfo
from . import commit as commits
from .container import NEW_FILE, ExecutableMissing, FileMeta, WorkContainer
from .engine import DockerEngine, ImageInfo

if TYPE_CHECKING:
    from ...engine.plan import PatchPlan

_LOCATE_SOURCE = (Path(__file__).parent.parent.parent / "inside" / "locate.py").read_text()
PYTHONS = ("python3", "python")


class ImageTarget:
    """A container made from `ref`, used as a patch target; use it as a context manager."""

    def __init__(self, ref: str, *, engine: DockerEngine | None = None) -> None:
        self.ref = ref
        self._engine = engine
        self._source: ImageInfo | None = None
        self._work: WorkContainer | None = None
        self._python: str | None = None
        self._dist: Distribution | None = None
        self._notes: list[str] = []
        self._layer: bytes | None = None
        self._stack = ExitStack()

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> ImageTarget:
        if self._source is None:
            self._engine = self._engine or DockerEngine()
            self._source = self._engine.image_info(self.ref)
            removed = self._engine.gc_containers()
            if removed:
                self._notes.append(f"removed {len(removed)} container(s) left by an earlier, killed run")
        self._work = self._start((self._python,) if self._python else PYTHONS)
        return self

    def __exit__(self, *exc: object) -> None:
        work, self._work = self._work, None
        try:
            self._stack.close()
        finally:
            if work is not None:
                self._notes.extend(work.notes)

    def _start(self, pythons: Sequence[str]) -> WorkContainer:
        assert self._engine and self._source
        for python in pythons:
            work = WorkContainer(self._engine, self._source.id, ref=self.ref, python=python,
                                 keepalive={"entrypoint": commits.keepalive_argv(python), "command": None})
            try:
                entered = self._stack.enter_context(work)
            except ExecutableMissing:
                continue
            self._python = python
            return entered
        raise TargetNotFound(
            f"image {self.ref} has no python3 or python on its PATH",
            hint="the tool runs the image's own interpreter; patch an image that has python",
        )

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
        result = self.run_python(_LOCATE_SOURCE, [distribution], timeout=120)
        if result.returncode != 0:
            raise CheckFailed(
                f"locating {distribution} in image {self.ref} failed "
                f"(exit {result.returncode}): {result.stderr.decode(errors='replace').strip()[-500:]}"
            )
        found = json.loads(result.stdout.decode().strip().splitlines()[-1])
        if not found["found"]:
            raise TargetNotFound(
                f"no {distribution} installed in image {self.ref} "
                f"(looked with {found['python']} {found['python_version']} "
                f"at sys.path {':'.join(found['sys_path'])})",
                hint=f"patch an image that has {distribution} installed",
            )
        if found["package_dir"] and posixpath.dirname(found["package_dir"]) != found["location"]:
            raise BadInput(
                f"in image {self.ref}, `import {distribution}` would load {found['package_dir']}, "
                f"not the installed distribution at {found['location']}",
                hint="remove the shadowing copy from the image's sys.path",
            )
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

    def read(self, path: str) -> bytes | None:
        found = self.container.copy_out(self._absolute(path))
        return None if found is None else found[0]

    def write(self, plan: PatchPlan) -> None:
        written: list[tuple[str, bytes | None, FileMeta | None]] = []  # (abs path, pre, meta)
        try:
            for file in plan.files:
                absolute = self._absolute(file.path)
                current = self.container.copy_out(absolute)
                meta = current[1] if current else None
                if file.post is None:
                    self.container.delete(absolute)
                else:
                    self.container.copy_into(absolute, file.post, meta or NEW_FILE)
                written.append((absolute, current[0] if current else None, meta))
        except BaseException:
            for absolute, pre, meta in reversed(written):
                self._put_back(absolute, pre, meta)
            raise

    def restore(self, plan: PatchPlan) -> None:
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
        return self.container.call([python, "-B", "-c", source, *args], env=env, timeout=timeout)

    # --- ImageCapable ---------------------------------------------------------------------
    def take_layer(self, paths: Sequence[str]) -> tuple[LayerEntry, ...]:
        """The new layer, taken from the work container now: the files `paths` (relative to the
        distribution's location) and every folder above them, as a tar the image's own python
        writes (owner, mode, mtime as they are here). Only this tar reaches the image."""
        absolute = [self._absolute(p) for p in paths]
        result = self.run_python(inside_source("layer"), absolute, timeout=300)
        if result.returncode != 0:
            raise CheckFailed(f"taking the new layer from the container failed: "
                              f"{result.stderr.decode(errors='replace').strip()[-300:]}")
        self._layer = result.stdout
        return layer_entries(self._layer)

    def source_labels(self) -> Mapping[str, str]:
        return self.source.config.get("Labels") or {}

    def commit(self, *, labels: Mapping[str, str], tag: str | None, force: bool = False) -> CommittedImage:
        """The layer `take_layer` took, on top of the source with the source's config and `labels`
        added. Nothing is tagged unless the result is verified (layers, config field by field)."""
        assert self._engine
        if self._layer is None:
            raise RuntimeError("take_layer() must run before commit()")
        return commits.commit(self._engine, self.source, self._layer, labels=labels, tag=tag, force=force)

    def push(self, tag: str) -> str:
        """Push a tag (e.g. the committed result) to its registry; returns the manifest digest."""
        assert self._engine
        return self._engine.push(tag)

    def refuse_existing_tag(self, tag: str, *, force: bool) -> None:
        """Fail early, before any work, when `tag` exists and may not be moved."""
        assert self._engine
        commits.refuse_existing_tag(self._engine, tag, force=force)

    def tag_source(self, tag: str, *, force: bool) -> CommittedImage:
        """Name the source image itself (it already carries the patch): no new layer."""
        assert self._engine
        self.refuse_existing_tag(tag, force=force)
        self._engine.tag(self.source.id, tag)
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
    """What a layer tar holds: each entry's path (absolute), kind and, for a file, its sha256."""
    entries = []
    with tarfile.open(fileobj=io.BytesIO(layer), mode="r:") as tar:
        for member in tar.getmembers():
            digest = None
            if member.isfile():
                extracted = tar.extractfile(member)
                assert extracted is not None
                digest = hashlib.sha256(extracted.read()).hexdigest()
            elif not member.isdir():
                raise CheckFailed(f"the new layer holds {member.name}, which is neither a file nor a folder")
            entries.append(LayerEntry(path="/" + member.name.lstrip("/"), folder=member.isdir(), sha256=digest))
    return tuple(entries)
