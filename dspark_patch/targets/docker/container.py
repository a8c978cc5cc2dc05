"""One container kept alive from an image, and the few operations everything else is built on:
`call` (exec; `start` for one that runs on beside the tool), `copy_out` / `copy_into` (one file, owner and mode kept). It is never
committed: the new layer is taken from it as a tar (target.py `take_layer`).

Use it as a context manager: the container is created and started on entry and force-removed
on every way out, also when starting fails or SIGTERM arrives; `DSPARK_PATCH_KEEP_CONTAINER=1`
keeps it for debugging and leaves a note saying how to remove it.

Everything run here runs as root in `/` with its environment given per exec, but the one check of
the image as it starts (its USER and WORKDIR; targets/docker/started.py).
"""

from __future__ import annotations

import io
import posixpath
import tarfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import docker.errors
from docker.utils.socket import frames_iter

from ...errors import EnvironmentProblem, UnsafePatch
from ..base import RunResult
from .client import DockerEngine, reason
from .naming import KEEP_ENV, container_name, keep_requested
from .signals import terminate_raises

if TYPE_CHECKING:
    from docker.models.containers import Container

@dataclass(frozen=True, kw_only=True)
class FileMeta:
    mode: int
    uid: int
    gid: int
    uname: str
    gname: str


NEW_FILE = FileMeta(mode=0o644, uid=0, gid=0, uname="root", gname="root")


class ExecutableMissing(Exception):
    """The keep-alive's interpreter is not in the image (the container was removed)."""


class RunningCall:
    """One exec started in the work container, read on a thread until it ends."""

    EXIT_WAIT_S = 15.0  # how long an exec whose output has ended may still show as running

    def __init__(self, api: Any, exec_id: str, *, program: str, timeout: float, wrapped: bool) -> None:
        self._api, self._exec_id, self._program = api, exec_id, program
        self._timeout, self._wrapped = timeout, wrapped
        self._box: dict[str, Any] = {}
        self._worker = threading.Thread(target=self._read, daemon=True)
        self._worker.start()

    def _read(self) -> None:
        try:
            sock = self._api.exec_start(self._exec_id, socket=True)
            try:
                self._box["out"] = demux(frames_iter(sock, False))
            finally:  # as docker-py's own read: the response, which closes its socket
                response = getattr(sock, "_response", None)
                (response or sock).close()
        except BaseException as exc:  # surfaced in the calling thread
            self._box["error"] = exc

    def wait(self, timeout: float | None = None) -> RunResult:
        """Its result; `timeout` (default: the one it was started with) counts from now."""
        self._worker.join((self._timeout if timeout is None else timeout) + 15)
        if self._worker.is_alive():
            return RunResult(returncode=-9, stdout=b"", stderr=b"timed out (no `timeout` in the image)", timed_out=True)
        if "error" in self._box:
            raise EnvironmentProblem(f"running {self._program} in the container failed: {reason(self._box['error'])}")
        stdout, stderr = self._box["out"] or (None, None)
        code = self._exit_code()
        if code is None:
            raise EnvironmentProblem(f"the engine ended the output of {self._program} in the container but never said "
                                     "how it exited", hint="run again; if it recurs, look at the engine's log")
        timed_out = self._wrapped and code in (124, 137)
        return RunResult(returncode=code, stdout=stdout or b"", stderr=stderr or b"", timed_out=timed_out)

    def _exit_code(self) -> int | None:
        """The exec's exit code. The engine ends the output stream when the process closes it
        and records the exit a moment later (its exit event is handled apart), so an exec that
        still shows as running is asked again, for up to EXIT_WAIT_S."""
        deadline = time.monotonic() + self.EXIT_WAIT_S
        while True:
            info = self._api.exec_inspect(self._exec_id)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)


def demux(frames: Iterable[tuple[int, bytes]]) -> tuple[bytes, bytes]:
    """An exec's (stdout, stderr) from the engine's multiplexed frames, read as Docker's own
    client reads them (stdcopy): stream 0 is written to stdout, 1 is stdout, 2 stderr, 3 the
    engine's own error text. docker-py's demux refuses stream 0, which Podman sends."""
    out: list[bytes] = []
    err: list[bytes] = []
    for stream, data in frames:
        if stream in (0, 1):
            out.append(data)
        elif stream in (2, 3):
            err.append(data)
        else:
            raise EnvironmentProblem(f"the engine sent an exec's output on stream {stream}, which no engine uses",
                                     hint="run again; if it recurs, look at the engine's version and log")
    return b"".join(out), b"".join(err)


class WorkContainer:
    """A container of `image_id` whose entrypoint/command are replaced by `keepalive`.

    `python` is the interpreter the keep-alive runs; small file operations use it too."""

    def __init__(
        self, engine: DockerEngine, image_id: str, *, ref: str, python: str, keepalive: Mapping[str, Any],
    ) -> None:
        self.ref = ref                # the image as the user named it, for messages
        self.python = python
        self._engine = engine
        self._image_id = image_id
        self._keepalive = dict(keepalive)
        self._container: Container | None = None
        self._name: str | None = None   # set before the create: what to remove if its answer is lost
        self._term = terminate_raises()
        self._has_timeout: bool | None = None
        self._timeout_check: threading.Thread | None = None
        self.notes: list[str] = []

    # --- lifecycle ----------------------------------------------------------------------
    def __enter__(self) -> WorkContainer:
        self._term.__enter__()
        try:
            self._start()
            return self
        except BaseException:
            # Whatever the start got to, held or only named: a SIGTERM after the start (the
            # container held) once left it, since a failed entry is never exited.
            self._leave()
            raise

    def __exit__(self, *exc: object) -> None:
        self._leave()

    def _leave(self) -> None:
        """Remove the container, held or only named; then give SIGTERM back. Safe to repeat."""
        try:
            try:
                self._remove()
            finally:
                self._remove_unheld()
        finally:
            self._term.__exit__(None, None, None)

    def _start(self) -> None:
        # The image's HEALTHCHECK probes a server that never starts here; left on, the engine
        # runs it every interval beside the tool's own work (under emulation each run is an
        # interpreter start of seconds on the CPU the probe needs). The result image's config
        # is the source's, never this container's, so it keeps its health check.
        self._name = container_name("target")
        self._container = self._engine.create_container(self._image_id, name=self._name,
                                                        healthcheck={"test": ["NONE"]}, **self._keepalive)
        try:
            self._container.start()
        except docker.errors.APIError as exc:
            missing = "executable file not found" in str(exc) or "no such file" in str(exc)
            self._remove(keep_allowed=not missing)  # nothing to debug in a container that never ran
            if missing:
                raise ExecutableMissing(self.python) from exc
            raise EnvironmentProblem(f"could not start a container from image {self.ref}: {reason(exc)}") from exc
        except BaseException:
            self._remove()
            raise
        # Whether the image has `timeout` is asked now, beside what the tool does next (load the
        # patch set, prepare the probe's early start), so the first exec, that early start, need
        # not wait for three more round trips first.
        self._timeout_check = threading.Thread(target=self._check_timeout, daemon=True)
        self._timeout_check.start()

    def _remove_unheld(self) -> None:
        """A start that failed with no container held: SIGTERM can land after the engine made
        it and before its answer was stored (`create_container` removes it by name only while
        its own call runs), so the name made for it is removed too; gone already is fine."""
        if self._container is None and self._name is not None:
            with self._term.deferred():
                try:
                    self._engine.remove_container(self._name)
                except Exception:
                    pass  # the error that stopped the start says more
                self._name = None

    def _remove(self, *, keep_allowed: bool = True) -> None:
        container = self._container
        if container is None:
            return
        if keep_allowed and keep_requested():
            self._container, self._name = None, None
            self.notes.append(f"kept container {container.short_id} ({KEEP_ENV}=1); "
                              f"remove it with `docker rm -f {container.short_id}`")
            return
        # Held until it is gone (a removal that fails keeps it, for the next try): a SIGTERM
        # now would leave it, so the removal finishes first.
        with self._term.deferred():
            try:
                container.remove(force=True, v=True)
            except docker.errors.NotFound:
                pass
            self._container, self._name = None, None

    @property
    def container(self) -> Container:
        if self._container is None:
            raise RuntimeError("WorkContainer used outside its with-block")
        return self._container

    @property
    def id(self) -> str:
        return str(self.container.id)

    @property
    def name(self) -> str:
        return str(self.container.name)

    # --- the four operations --------------------------------------------------------------
    def call(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
             user: str = "0", workdir: str = "/") -> RunResult:
        """Run argv in the container (as root in `/` unless `user` and `workdir` say otherwise),
        env for this exec only, stopped after `timeout`."""
        return self.start(argv, env=env, timeout=timeout, user=user, workdir=workdir).wait()

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float,
              user: str = "0", workdir: str = "/") -> RunningCall:
        """`call`, but returning at once: the exec runs on while the caller does other work.
        It ends with the container at the latest (removing it kills every process in it)."""
        api = self.container.client.api
        argv = list(argv)
        # `timeout` (coreutils/busybox) stops the process inside the container; the host-side
        # wait only guards against images without it.
        wrapped = ["timeout", "-k", "5", str(max(1, int(timeout))), *argv] if self._timeout_available() else argv
        exec_id = self._exec_create(wrapped, environment=dict(env or {}), user=user, workdir=workdir)
        return RunningCall(api, exec_id, program=argv[0], timeout=timeout, wrapped=wrapped is not argv)

    def copy_out(self, absolute: str) -> tuple[bytes, FileMeta] | None:
        """A regular file's bytes and owner/mode (None if it does not exist), extracted in
        memory from the engine's tar stream."""
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
            meta = FileMeta(mode=member.mode, uid=member.uid, gid=member.gid,
                            uname=member.uname, gname=member.gname)
            return extracted.read(), meta

    def copy_into(self, absolute: str, data: bytes, meta: FileMeta) -> None:
        """Write one file with the given owner and mode, making its folder if it is new."""
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
                self._python_op("import os, sys\nos.makedirs(sys.argv[1], mode=0o755, exist_ok=True)",
                                parent, failed=f"could not create {parent} in the container")
                ok = self.container.put_archive(parent, buffer.getvalue())
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"writing {absolute} into the container failed: {reason(exc)}") from exc
        if not ok:
            raise EnvironmentProblem(f"writing {absolute} into the container failed")

    def copy_many(self, files: Sequence[tuple[str, bytes, FileMeta]]) -> None:
        """Write files that exist already (their folders do) with the given owners and modes, in
        one archive extracted at their deepest common folder."""
        if len(files) == 1:
            self.copy_into(*files[0])
            return
        parent = posixpath.commonpath([posixpath.dirname(path) for path, _, _ in files])
        buffer = io.BytesIO()
        now = int(time.time())
        with tarfile.open(fileobj=buffer, mode="w:", format=tarfile.PAX_FORMAT) as tar:
            for path, data, meta in files:
                member = tarfile.TarInfo(posixpath.relpath(path, parent))
                member.size = len(data)
                member.mode, member.uid, member.gid = meta.mode, meta.uid, meta.gid
                member.uname, member.gname = meta.uname, meta.gname
                member.mtime = now
                tar.addfile(member, io.BytesIO(data))
        try:
            ok = self.container.put_archive(parent, buffer.getvalue())
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"writing {len(files)} files under {parent} into the container failed: {reason(exc)}") from exc
        if not ok:
            raise EnvironmentProblem(f"writing {len(files)} files under {parent} into the container failed")

    def exists(self, absolute: str) -> bool:
        try:
            self.container.get_archive(absolute)
        except docker.errors.NotFound:
            return False
        return True

    def delete(self, absolute: str) -> None:
        self._python_op("import os, sys\nos.remove(sys.argv[1])", absolute,
                        failed=f"could not delete {absolute} in the container")

    # --- internals ----------------------------------------------------------------------
    def _python_op(self, code: str, path: str, *, failed: str) -> None:
        result = self.call([self.python, "-I", "-B", "-c", code, path], timeout=60)
        if result.returncode != 0:
            raise EnvironmentProblem(f"{failed}: {result.stderr.decode(errors='replace').strip()}")

    def _exec_create(self, argv: list[str], *, environment: dict[str, str] | None = None, user: str = "0",
                     workdir: str = "/") -> str:
        try:
            # A neutral cwd by default: the image's WORKDIR may hold modules that shadow the stdlib.
            return str(self.container.client.api.exec_create(self.container.id, argv, user=user,
                                                              environment=environment, workdir=workdir)["Id"])
        except docker.errors.APIError as exc:
            # The keep-alive process is gone (an image whose python does not run): one clean line.
            raise EnvironmentProblem(f"the work container of image {self.ref} is not running any more "
                                     f"(its {self.python} exited?): {reason(exc)}",
                                     hint="check that the image's python runs: docker run --rm --entrypoint "
                                          f"{self.python} IMAGE -c pass") from exc

    def _timeout_available(self) -> bool:
        check, self._timeout_check = self._timeout_check, None
        if check is not None:
            check.join()
        if self._has_timeout is None:  # not asked yet, or the early ask failed: ask (and fail) here
            self._check_timeout(quiet=False)
        assert self._has_timeout is not None
        return self._has_timeout

    def _check_timeout(self, *, quiet: bool = True) -> None:
        try:
            api = self.container.client.api
            exec_id = self._exec_create(["timeout", "--help"])
            api.exec_start(exec_id)
            code = api.exec_inspect(exec_id)["ExitCode"]
        except Exception:
            if quiet:  # the calling thread asks again and gets the error itself
                return
            raise
        self._has_timeout = code in (0, 1)  # busybox prints usage and exits 1
