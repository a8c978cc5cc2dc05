"""A container image as a patch target. The only module that talks to the Docker engine.

`ImageTarget` starts one container from the image (its entrypoint replaced by a keep-alive run
by the image's own python, networking off, marked with our label), reads and writes files
through the engine's archive API, runs the image's python per exec, and commits the result as
one layer on top of the source, restoring the source's config exactly. The container is
force-removed on every path; leftovers of a killed run are collected by the next one.

Traps this module exists to avoid (each one seen on a real engine):
- Anything set on the container's config (env, user, entrypoint, labels) can leak into the
  committed image: the engine fills every field the commit config leaves empty from the
  container's config. So env and user are given per exec, and the keep-alive is placed where
  the source config already has a value (see `_keepalive_config`).
- Python run as root in an image without precompiled stdlib writes
  /usr/lib/python3.X/__pycache__/*.pyc into the layer: every python we run gets `-B`.
"""

from __future__ import annotations

import copy
import json
import io
import os
import posixpath
import secrets
import signal
import socket
import tarfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

import docker
import docker.errors
import requests.exceptions

from ..errors import (
    BadInput,
    CheckFailed,
    EngineUnreachable,
    EnvironmentProblem,
    LayerMismatch,
    TagExists,
    TargetNotFound,
    UnsafePatch,
)
from .base import Distribution, RecordEntry, RunResult, TargetInfo

if TYPE_CHECKING:
    from docker.models.containers import Container

    from ..engine.plan import PatchPlan

# Our containers are marked by name, not by label: a commit copies the container's labels into
# the image (the engine merges them into the commit config), so a marker label would end up in
# every patched image. Name: dspark-patch--ROLE--HOST--PID--STARTTIME--RANDOM.
NAME_PREFIX = "dspark-patch--"
KEEP_ENV = "DSPARK_PATCH_KEEP_CONTAINER"

KEEPALIVE = "import time\nwhile True: time.sleep(3600)"
_LOCATE_SOURCE = (Path(__file__).parent.parent / "inside" / "locate.py").read_text()
# Config fields a commit must carry over from the source unchanged (Labels: plus ours).
CONFIG_FIELDS = (
    "Entrypoint", "Cmd", "User", "WorkingDir", "Env", "ExposedPorts", "Volumes", "Labels",
    "StopSignal", "Healthcheck", "Shell", "OnBuild", "ArgsEscaped",
)

ChangeKind = Literal["A", "C", "D"]
_DIFF_KINDS: dict[int, ChangeKind] = {0: "C", 1: "A", 2: "D"}


class ImageInfo(NamedTuple):
    id: str                       # sha256:...
    config: dict[str, Any]        # the image's Config, as the engine reports it
    layers: int                   # number of filesystem layers (RootFS.Layers)
    repo_tags: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class CommittedImage:
    ref: str                      # the tag given, or the id when committed without a tag
    id: str
    layers: int


@dataclass(frozen=True, kw_only=True)
class ServerRun:
    log: str
    container_id: str
    image_id: str
    env: tuple[tuple[str, str], ...]
    args: tuple[str, ...]
    exit_code: int | None         # None: still running when stopped (pattern seen or timeout)
    matched: bool                 # `until` returned True
    timed_out: bool


@dataclass(frozen=True, kw_only=True)
class _FileMeta:
    mode: int
    uid: int
    gid: int
    uname: str
    gname: str


def _engine_host() -> str:
    return os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")


def _container_name(role: str) -> str:
    """A fresh name saying who made the container: role (`-kept` when kept), host, pid, start."""
    if os.environ.get(KEEP_ENV) == "1":
        role += "-kept"
    host = "".join(c if c.isalnum() or c in "_.-" else "_" for c in socket.gethostname())
    pid = os.getpid()
    return f"{NAME_PREFIX}{role}--{host}--{pid}--{_start_time(pid)}--{secrets.token_hex(3)}"


@dataclass(frozen=True, kw_only=True)
class _Owner:
    role: str
    host: str
    pid: int
    start: str

    @classmethod
    def parse(cls, name: str) -> _Owner | None:
        parts = name.lstrip("/").removeprefix(NAME_PREFIX).split("--")
        if not name.lstrip("/").startswith(NAME_PREFIX) or len(parts) != 5 or not parts[2].isdigit():
            return None
        return cls(role=parts[0], host=parts[1], pid=int(parts[2]), start=parts[3])

    @property
    def kept(self) -> bool:
        return self.role.endswith("-kept")

    @property
    def here(self) -> bool:
        return self.host == "".join(c if c.isalnum() or c in "_.-" else "_" for c in socket.gethostname())

    def alive(self) -> bool:
        return _start_time(self.pid) == self.start


def _start_time(pid: int) -> str:
    # A pid alone can be reused; pid plus its start time names one process.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[1].split()[19]


class DockerEngine:
    """A connection to one Docker engine, with the few operations the tool needs."""

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        self.host = _engine_host()
        try:
            self.client = client or docker.from_env()
            self.client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise EngineUnreachable(
                f"cannot reach a Docker engine at {self.host}: {_reason(exc)}",
                hint="start one (scripts/ensure-docker) or point DOCKER_HOST at one",
            ) from exc

    # --- images -------------------------------------------------------------------------
    def image_info(self, ref: str) -> ImageInfo:
        try:
            image = self.client.images.get(ref)
        except docker.errors.ImageNotFound as exc:
            raise TargetNotFound(
                f"image {ref} not found on the engine at {self.host}",
                hint="check `docker images`, pull or build it (scripts/build-images for the fixtures)",
            ) from exc
        except docker.errors.APIError as exc:
            raise BadInput(f"image reference {ref!r} is not usable: {_reason(exc)}") from exc
        attrs = image.attrs
        return ImageInfo(
            id=image.id,
            config=copy.deepcopy(attrs.get("Config") or {}),
            layers=len((attrs.get("RootFS") or {}).get("Layers") or ()),
            repo_tags=tuple(attrs.get("RepoTags") or ()),
        )

    def tag_exists(self, name: str) -> bool:
        try:
            self.client.images.get(name)
        except docker.errors.ImageNotFound:
            return False
        return True

    def remove_image(self, ref: str, *, force: bool = False) -> None:
        try:
            self.client.images.remove(ref, force=force)
        except docker.errors.ImageNotFound:
            pass

    def tag(self, image_id: str, name: str) -> None:
        repository, tag = _split_tag(name)
        self.client.images.get(image_id).tag(repository, tag)

    def push(self, tag: str) -> str:
        """Push `tag` to its registry; returns the pushed manifest digest (sha256:...)."""
        repository, name_tag = _split_tag(tag)
        digest = None
        try:
            for event in self.client.images.push(repository, tag=name_tag, stream=True, decode=True):
                if "error" in event:
                    raise EnvironmentProblem(
                        f"pushing {tag} failed: {event['error']}",
                        hint="check that the registry is running and reachable from the engine",
                    )
                digest = (event.get("aux") or {}).get("Digest", digest)
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"pushing {tag} failed: {_reason(exc)}") from exc
        if digest is None:
            raise EnvironmentProblem(f"pushing {tag} reported no digest")
        return digest

    # --- containers ---------------------------------------------------------------------
    def our_containers(self) -> list[tuple[str, str]]:
        """(id, name) of every container of ours on the engine, running or not."""
        # The low-level list: the high-level one inspects each container, and containers of
        # other runs may vanish in between.
        found = _list_containers(self.client.api, NAME_PREFIX)
        ours = []
        for entry in found:
            for name in entry.get("Names") or ():
                if _Owner.parse(name) is not None:
                    ours.append((entry["Id"], name.lstrip("/")))
        return ours

    def gc_containers(self, *, include_kept: bool = False, include_other_hosts: bool = False) -> list[str]:
        """Remove containers of ours whose run is gone; returns their names.

        A container is left alone while the process that made it runs, when it was kept on
        purpose (unless `include_kept`), or when it was made on another host (unless
        `include_other_hosts`: its owner cannot be checked from here)."""
        removed = []
        for container_id, name in self.our_containers():
            owner = _Owner.parse(name)
            assert owner is not None
            if owner.kept and not include_kept:
                continue
            if not owner.here and not include_other_hosts:
                continue
            if owner.here and owner.alive():
                continue
            try:
                self.client.api.remove_container(container_id, force=True, v=True)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as exc:
                if "already in progress" in str(exc):  # another run is collecting it right now
                    continue
                raise
            removed.append(name)
        return removed

    def run_server(
        self,
        image_id: str,
        *,
        env: Mapping[str, str],
        command_args: Sequence[str],
        device_requests_all_gpus: bool,
        until: Callable[[str], bool],
        timeout: float,
        poll_s: float = 0.5,
    ) -> ServerRun:
        """Start the image with its own entrypoint, `command_args` and `env`; follow its log
        until `until(log)` holds, the timeout passes or it exits; then stop and remove it."""
        device_requests = (
            [docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])]
            if device_requests_all_gpus else None
        )
        try:
            container = self.client.containers.create(
                image_id,
                command=list(command_args),
                environment=dict(env),
                name=_container_name("server"),
                network_mode="none",
                device_requests=device_requests,
            )
        except docker.errors.ImageNotFound as exc:
            raise TargetNotFound(f"image {image_id} not found on the engine at {self.host}") from exc
        log = ""
        exit_code = None
        matched = timed_out = False
        with _terminate_raises():
            try:
                container.start()
                deadline = time.monotonic() + timeout
                while True:
                    container.reload()
                    running = container.status in ("running", "created", "restarting")
                    log = container.logs(stdout=True, stderr=True).decode("utf-8", "replace")
                    if until(log):
                        matched = True
                        break
                    if not running:
                        exit_code = int(container.attrs["State"]["ExitCode"])
                        break
                    if time.monotonic() > deadline:
                        timed_out = True
                        break
                    time.sleep(poll_s)
            except docker.errors.APIError as exc:
                raise EnvironmentProblem(
                    f"could not run image {image_id}: {_reason(exc)}",
                    hint="a GPU run needs the NVIDIA container toolkit on the engine's host"
                    if device_requests_all_gpus else None,
                ) from exc
            finally:
                if os.environ.get(KEEP_ENV) != "1":
                    try:
                        container.remove(force=True, v=True)
                    except docker.errors.NotFound:
                        pass
        return ServerRun(
            log=log,
            container_id=container.id,
            image_id=image_id,
            env=tuple(sorted(env.items())),
            args=tuple(command_args),
            exit_code=exit_code,
            matched=matched,
            timed_out=timed_out,
        )


def _list_containers(api: Any, name: str) -> list[dict[str, Any]]:
    # The engine's list call itself can answer "No such container" when a container is being
    # removed while it lists (seen with dockerd 20.10 under concurrent runs); list again.
    for attempt in range(5):
        try:
            return api.containers(all=True, filters={"name": name})
        except docker.errors.NotFound:
            if attempt == 4:
                raise
            time.sleep(0.05 * (attempt + 1))
    return []


def gc_containers(engine: DockerEngine | None = None, *, include_kept: bool = True) -> list[str]:
    """What `dspark-patch gc` runs: remove every container of ours whose run is gone,
    including kept ones (the user asked to clean up). Returns the removed containers' names."""
    return (engine or DockerEngine()).gc_containers(include_kept=include_kept)


class ImageTarget:
    """A container made from `ref`, used as a patch target; use it as a context manager."""

    def __init__(self, ref: str, *, engine: DockerEngine | None = None) -> None:
        self.ref = ref
        self._engine = engine
        self._container: Container | None = None
        self._source: ImageInfo | None = None
        self._python: str | None = None
        self._dist: Distribution | None = None
        self._notes: list[str] = []
        self._term = _terminate_raises()

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> ImageTarget:
        if self._source is not None:  # a twin: its first container did the checks and gc
            self._term.__enter__()
            try:
                self._start(pythons=(self._python,) if self._python else ("python3", "python"))
            except BaseException:
                self._remove()
                self._term.__exit__(None, None, None)
                raise
            return self
        self._engine = self._engine or DockerEngine()
        self._source = self._engine.image_info(self.ref)
        removed = self._engine.gc_containers()
        if removed:
            self._notes.append(f"removed {len(removed)} container(s) left by an earlier, killed run")
        self._term.__enter__()
        try:
            self._start()
        except BaseException:
            self._remove()
            self._term.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._remove()
        finally:
            self._term.__exit__(None, None, None)

    def twin(self) -> ImageTarget:
        """Another container of the same source image that knows what `locate` found here.

        Used as a scratch copy: what runs there (the probe) can never reach this container's
        committed layer, and it runs while this container's changes are being listed."""
        twin = ImageTarget(self.ref, engine=self._engine)
        twin._source, twin._python, twin._dist = self.source, self._python, self._dist
        return twin

    def _start(self, pythons: tuple[str, ...] = ("python3", "python")) -> None:
        assert self._engine and self._source
        for python in pythons:
            config = _keepalive_config(self._source.config, python)
            self._container = self._engine.client.containers.create(
                self._source.id,
                name=_container_name("target"),
                network_mode="none",
                **config,
            )
            try:
                self._container.start()
            except docker.errors.APIError as exc:
                if "executable file not found" not in str(exc) and "no such file" not in str(exc):
                    raise EnvironmentProblem(
                        f"could not start a container from image {self.ref}: {_reason(exc)}"
                    ) from exc
                self._remove(keep_allowed=False)  # nothing to debug in a container that never ran
                continue
            self._python = python
            return
        raise TargetNotFound(
            f"image {self.ref} has no python3 or python on its PATH",
            hint="the tool runs the image's own interpreter; patch an image that has python",
        )

    def _remove(self, *, keep_allowed: bool = True) -> None:
        container, self._container = self._container, None
        if container is None:
            return
        if keep_allowed and os.environ.get(KEEP_ENV) == "1":
            self._notes.append(f"kept container {container.short_id} ({KEEP_ENV}=1); "
                               f"remove it with `docker rm -f {container.short_id}`")
            return
        try:
            container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass

    @property
    def container(self) -> Container:
        if self._container is None:
            raise RuntimeError("ImageTarget used outside its with-block")
        return self._container

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
        found = self._fetch(self._absolute(path))
        return None if found is None else found[0]

    def write(self, plan: PatchPlan) -> None:
        written: list[tuple[str, bytes | None, _FileMeta | None]] = []  # (abs path, pre, meta)
        try:
            for file in plan.files:
                absolute = self._absolute(file.path)
                current = self._fetch(absolute)
                meta = current[1] if current else None
                if file.post is None:
                    self._delete(absolute)
                else:
                    self._put(absolute, file.post, meta or self._new_file_meta())
                written.append((absolute, current[0] if current else None, meta))
        except BaseException:
            for absolute, pre, meta in reversed(written):
                self._put_back(absolute, pre, meta)
            raise

    def restore(self, plan: PatchPlan) -> None:
        for file in plan.files:
            absolute = self._absolute(file.path)
            current = self._fetch(absolute)
            self._put_back(absolute, file.pre, current[1] if current else None)

    def run_python(
        self,
        source: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 600.0,
    ) -> RunResult:
        python = self._dist.python if self._dist else self._python
        assert python
        return self._exec([python, "-B", "-c", source, *args], env=env, timeout=timeout)

    # --- image-only operations ----------------------------------------------------------
    def changes(self) -> list[tuple[ChangeKind, str]]:
        """The container's filesystem changes against the image (what a commit would bake)."""
        diff = self.container.diff() or []
        return sorted((_DIFF_KINDS[d["Kind"]], d["Path"]) for d in diff)

    def commit(
        self,
        *,
        labels: Mapping[str, str],
        tag: str | None,
        force: bool = False,
        source_config: Mapping[str, Any] | None = None,
        message: str = "dspark-patch",
    ) -> CommittedImage:
        """One new layer on top of the source with the source's config and `labels` added.

        Nothing is tagged unless the result is verified (layers, config field by field)."""
        assert self._engine
        source = self.source
        if tag and self._engine.tag_exists(tag) and not force:
            raise TagExists(
                f"tag {tag} already exists ({self._engine.image_info(tag).id})",
                hint="choose another --tag, or pass --force to move it to the patched image",
            )
        expected = copy.deepcopy(dict(source_config if source_config is not None else source.config))
        expected["Labels"] = {**(expected.get("Labels") or {}), **labels}
        try:
            image = self.container.commit(conf=expected, message=message, author="dspark-patch", pause=True)
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"committing the patched container failed: {_reason(exc)}") from exc
        try:
            result = self._engine.image_info(image.id)
            _check_commit(source, result, expected)
            if tag:
                self._engine.tag(result.id, tag)
        except BaseException:
            self._engine.remove_image(image.id, force=True)
            raise
        return CommittedImage(ref=tag or result.id, id=result.id, layers=result.layers)

    def push(self, tag: str) -> str:
        """Push a tag (e.g. the committed result) to its registry; returns the manifest digest."""
        assert self._engine
        return self._engine.push(tag)

    def refuse_existing_tag(self, tag: str, *, force: bool) -> None:
        """Fail early, before any work, when `tag` exists and may not be moved."""
        assert self._engine
        if self._engine.tag_exists(tag) and not force:
            raise TagExists(
                f"tag {tag} already exists ({self._engine.image_info(tag).id})",
                hint="choose another --tag, or pass --force to move it to the patched image",
            )

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

    def _fetch(self, absolute: str) -> tuple[bytes, _FileMeta] | None:
        """A file's bytes and owner/mode, extracted in memory from the engine's tar stream."""
        try:
            stream, _ = self.container.get_archive(absolute)
        except docker.errors.NotFound:
            return None
        data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
            members = tar.getmembers()
            member = members[0] if members else None
            if member is None or not member.isfile() or len(members) != 1:
                what = "a symlink" if member is not None and member.issym() else "not a regular file"
                raise UnsafePatch(
                    f"{absolute} in image {self.ref} is {what}; the tool only patches regular files"
                )
            extracted = tar.extractfile(member)
            assert extracted is not None
            meta = _FileMeta(mode=member.mode, uid=member.uid, gid=member.gid,
                             uname=member.uname, gname=member.gname)
            return extracted.read(), meta

    def _new_file_meta(self) -> _FileMeta:
        return _FileMeta(mode=0o644, uid=0, gid=0, uname="root", gname="root")

    def _put(self, absolute: str, data: bytes, meta: _FileMeta) -> None:
        parent, name = posixpath.split(absolute)
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w:", format=tarfile.PAX_FORMAT) as tar:
            member = tarfile.TarInfo(name)
            member.size = len(data)
            member.mode, member.uid, member.gid = meta.mode, meta.uid, meta.gid
            member.uname, member.gname = meta.uname, meta.gname
            member.mtime = int(time.time())
            tar.addfile(member, io.BytesIO(data))
        try:
            try:
                ok = self.container.put_archive(parent, buffer.getvalue())
            except docker.errors.NotFound:
                self._ensure_dir(parent)  # a new file in a new folder: make the folder first
                ok = self.container.put_archive(parent, buffer.getvalue())
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"writing {absolute} into the container failed: {_reason(exc)}") from exc
        if not ok:
            raise EnvironmentProblem(f"writing {absolute} into the container failed")

    def _ensure_dir(self, directory: str) -> None:
        code = "import os, sys\nos.makedirs(sys.argv[1], mode=0o755, exist_ok=True)"
        result = self._exec([self._python or "python3", "-B", "-c", code, directory], timeout=60)
        if result.returncode != 0:
            raise EnvironmentProblem(
                f"could not create {directory} in the container: {result.stderr.decode(errors='replace').strip()}"
            )

    def _delete(self, absolute: str) -> None:
        code = "import os, sys\nos.remove(sys.argv[1])"
        result = self._exec([self._python or "python3", "-B", "-c", code, absolute], timeout=60)
        if result.returncode != 0:
            raise EnvironmentProblem(
                f"could not delete {absolute} in the container: {result.stderr.decode(errors='replace').strip()}"
            )

    def _put_back(self, absolute: str, pre: bytes | None, meta: _FileMeta | None) -> None:
        if pre is None:
            if self._fetch_exists(absolute):
                self._delete(absolute)
        else:
            self._put(absolute, pre, meta or self._new_file_meta())

    def _fetch_exists(self, absolute: str) -> bool:
        try:
            self.container.get_archive(absolute)
        except docker.errors.NotFound:
            return False
        return True

    def _exec(self, argv: list[str], *, env: Mapping[str, str] | None = None, timeout: float) -> RunResult:
        """Run argv as root in the container, env for this exec only, stopped after `timeout`."""
        api = self.container.client.api
        # `timeout` (coreutils/busybox) stops the process inside the container; the host-side
        # wait below only guards against images without it.
        wrapped = ["timeout", "-k", "5", str(max(1, int(timeout))), *argv] if self._has_timeout() else argv
        exec_id = api.exec_create(self.container.id, wrapped, user="0", environment=dict(env or {}))["Id"]
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["out"] = api.exec_start(exec_id, demux=True)
            except BaseException as exc:  # surfaced in the calling thread
                box["error"] = exc

        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout + 15)
        if worker.is_alive():
            return RunResult(returncode=-9, stdout=b"", stderr=b"timed out (no `timeout` in the image)", timed_out=True)
        if "error" in box:
            raise EnvironmentProblem(f"running {argv[0]} in the container failed: {_reason(box['error'])}")
        stdout, stderr = box["out"] or (None, None)
        code = api.exec_inspect(exec_id)["ExitCode"]
        timed_out = wrapped is not argv and code in (124, 137)
        return RunResult(returncode=code, stdout=stdout or b"", stderr=stderr or b"", timed_out=timed_out)

    def _has_timeout(self) -> bool:
        if not hasattr(self, "_timeout_known"):
            api = self.container.client.api
            exec_id = api.exec_create(self.container.id, ["timeout", "--help"], user="0")["Id"]
            api.exec_start(exec_id)
            code = api.exec_inspect(exec_id)["ExitCode"]
            self._timeout_known = code in (0, 1)  # busybox prints usage and exits 1
        return self._timeout_known


def _keepalive_config(source: Mapping[str, Any], python: str) -> dict[str, Any]:
    """Entrypoint/command for the keep-alive container, placed so a commit cannot leak them.

    A commit fills empty fields of the config we give it from the container's config. With a
    source ENTRYPOINT the keep-alive replaces the entrypoint, and the commit restores it and
    leaves CMD as the source has it (null stays null). Without one, the keep-alive is the
    command and the entrypoint is left unset (the image's own: null or []), so the commit
    restores the source's CMD and its entrypoint exactly. Only an image with neither cannot
    be committed exactly (the keep-alive would become its CMD); `_check_commit` refuses it."""
    argv = [python, "-B", "-c", KEEPALIVE]
    if source.get("Entrypoint"):
        return {"entrypoint": argv, "command": None}
    return {"command": argv}


def _check_commit(source: ImageInfo, result: ImageInfo, expected: Mapping[str, Any]) -> None:
    if result.layers != source.layers + 1:
        raise LayerMismatch(
            f"the committed image has {result.layers} layers, expected {source.layers} + 1",
            hint="report this: the engine did not add exactly one layer",
        )
    differing = []
    for field in CONFIG_FIELDS:
        want, got = expected.get(field), result.config.get(field)
        if want != got:
            differing.append(f"{field}: {want!r} became {got!r}")
    if differing:
        raise CheckFailed(
            "the committed image's config differs from the source's: " + "; ".join(differing),
            hint="nothing was tagged; an image with neither ENTRYPOINT nor CMD cannot be committed "
            "exactly: give it one",
        )


def _split_tag(name: str) -> tuple[str, str]:
    # "host:5000/repo:tag" -> ("host:5000/repo", "tag"); no tag -> "latest".
    repository, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        return name, "latest"
    return repository, tag


def _reason(exc: BaseException) -> str:
    if isinstance(exc, docker.errors.APIError) and exc.explanation:
        return str(exc.explanation)
    return str(exc).strip() or type(exc).__name__


class _terminate_raises:
    """While active, SIGTERM raises SystemExit(143) so `finally` blocks remove containers.

    Only the main thread may install signal handlers; elsewhere this does nothing."""

    def __init__(self) -> None:
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> _terminate_raises:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, _raise_exit)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)

