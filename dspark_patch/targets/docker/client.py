"""A connection to one Docker engine and the few operations the tool needs of it.

Images (inspect, tag, push, remove), our containers (list, collect a killed run's), and one
small surface to run an image with its own entrypoint (`started`: create, start, state, logs,
remove on every path), which `evaluate/server.py` builds its server runs on.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import docker.types
import requests.exceptions

from ...errors import BadInput, EngineUnreachable, EnvironmentProblem, TargetNotFound
from ...imageref import ImageRef
from ..base import ImageInfo, PullCallback, PullPolicy
from . import transfer
from .naming import NAME_PREFIX, Owner, container_name, keep_requested
from .signals import terminate_raises, terminate_sweeps


@dataclass(frozen=True, kw_only=True)
class ContainerState:
    running: bool
    exit_code: int | None         # None while it runs


ENGINE_TIMEOUT_S = 300


class DockerEngine:
    """A connection to one Docker engine, with the few operations the tool needs."""

    def __init__(self, client: docker.DockerClient | None = None) -> None:
        self.host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        try:
            # The SDK's default is 60 s a request; an engine busy saving or loading gigabytes
            # for other clients can take longer to answer a removal or an inspect.
            # from_env asks the engine's API version (GET /version): that already proves it answers.
            self.client = client or docker.from_env(timeout=ENGINE_TIMEOUT_S)
            if client is not None:
                self.client.ping()
        except (docker.errors.DockerException, requests.exceptions.RequestException) as exc:
            raise EngineUnreachable(
                f"cannot reach a Docker engine at {self.host}: {reason(exc)}",
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
            raise BadInput(f"image reference {ref!r} is not usable: {reason(exc)}") from exc
        attrs = image.attrs
        return ImageInfo(
            id=image.id,
            config=copy.deepcopy(attrs.get("Config") or {}),
            layers=len((attrs.get("RootFS") or {}).get("Layers") or ()),
            repo_tags=tuple(attrs.get("RepoTags") or ()),
            diff_ids=tuple((attrs.get("RootFS") or {}).get("Layers") or ()),
            architecture=attrs.get("Architecture") or "",
            os=attrs.get("Os") or "",
            variant=attrs.get("Variant") or "",
            repo_digests=tuple(attrs.get("RepoDigests") or ()),
        )

    def history(self, image_id: str) -> list[dict[str, Any]]:
        """The image's history as the engine reports it, newest first."""
        return list(self.client.api.history(image_id))

    def load(self, archive: bytes) -> None:
        """Load a `docker save`-format archive (append.py builds one holding a single new layer)."""
        try:
            for event in self.client.api.load_image(archive, quiet=True) or ():
                if isinstance(event, dict) and event.get("error"):
                    raise EnvironmentProblem(f"loading the patched image failed: {event['error']}")
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"loading the patched image failed: {reason(exc)}") from exc

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

    def untag(self, name: str) -> str | None:
        """Remove the name `name`; the image goes too when nothing else names or uses it.
        Returns the id of the image it named, or None if there was no such name."""
        try:
            image_id = str(self.client.images.get(name).id)
            self.client.images.remove(name, noprune=False)
        except docker.errors.ImageNotFound:
            return None
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"removing the tag {name} failed: {reason(exc)}",
                                     hint=f"remove it by hand: docker rmi {name}") from exc
        return image_id

    def tag(self, image_id: str, name: str) -> None:
        ref = ImageRef.parse(name)
        self.client.api.tag(image_id, ref.name, ref.tag_or_latest)  # one call (images.get(...).tag is an inspect first)

    def push(self, tag: str) -> str:
        """Push `tag` to its registry; returns the pushed manifest digest (sha256:...)."""
        return transfer.push_image(self.client.api, tag)

    def registry_digest(self, tag: str) -> str | None:
        """The manifest digest `tag` names in its registry now (the engine asks the registry with
        the docker config's login); None when the engine cannot say (an engine without the call)."""
        try:
            found = self.client.api.inspect_distribution(tag)
        except (docker.errors.APIError, requests.exceptions.RequestException):
            return None
        digest = (found.get("Descriptor") or {}).get("digest")
        return str(digest) if digest else None

    def ensure_image(self, ref: str, *, pull: PullPolicy, platform: str | None = None,
                     on_progress: PullCallback | None = None) -> tuple[ImageInfo, bool]:
        """`ref` on this engine, pulled first as `pull` says (docker run's --pull); returns its
        info and whether it was pulled. An image id is never pulled."""
        if pull == "always" and not transfer.is_image_id(ref):
            transfer.pull_image(self.client.api, ref, platform=platform, on_progress=on_progress)
            return self.image_info(ref), True
        try:
            return self.image_info(ref), False
        except TargetNotFound:
            if pull == "never" or transfer.is_image_id(ref):
                raise
        transfer.pull_image(self.client.api, ref, platform=platform, on_progress=on_progress)
        return self.image_info(ref), True

    def path_stat(self, container_id: str, path: str) -> dict[str, Any] | None:
        """The engine's stat of `path` in a container (started or not; nothing runs): name, size,
        mode (Go's FileMode bits) and linkTarget (the link resolved in the container), or None."""
        try:
            stream, stat = self.client.api.get_archive(container_id, path)
        except docker.errors.NotFound:
            return None
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"reading {path} in container {container_id[:12]} failed: {reason(exc)}") from exc
        stream.close()  # only the stat header was wanted; the tar is never read
        return dict(stat)

    # --- our containers -----------------------------------------------------------------
    def our_containers(self) -> list[tuple[str, str]]:
        """(id, name) of every container of ours on the engine, running or not."""
        # The low-level list: the high-level one inspects each container, and containers of
        # other runs may vanish in between.
        found = _list_containers(self.client.api, NAME_PREFIX)
        ours = []
        for entry in found:
            for name in entry.get("Names") or ():
                if Owner.parse(name) is not None:
                    ours.append((entry["Id"], name.lstrip("/")))
        return ours

    def gc_containers(self, *, include_kept: bool = False, include_other_hosts: bool = False) -> list[str]:
        """Remove containers of ours whose run is gone; returns their names.

        A container is left alone while the process that made it runs, when it was kept on
        purpose (unless `include_kept`), or when it was made on another host (unless
        `include_other_hosts`: its owner cannot be checked from here)."""
        return self._remove_ours(lambda owner: (include_kept or not owner.kept)
                                 and (owner.here or include_other_hosts)
                                 and not (owner.here and owner.alive()))

    def remove_own_containers(self) -> list[str]:
        """Remove every container this process made (not kept ones); returns their names. What
        a SIGTERM runs where the containers belong to other threads (`terminate_sweeps`): one
        the engine refuses to remove is passed over, so that the others still go."""
        return self._remove_ours(lambda owner: owner.mine and not owner.kept, refused_is_fine=True)

    def _remove_ours(self, wanted: Callable[[Owner], bool], *, refused_is_fine: bool = False) -> list[str]:
        """Remove the containers of ours whose owner (read from the name) is `wanted`; returns
        their names. Gone already, or being removed by another run right now, is passed over."""
        removed = []
        for container_id, name in self.our_containers():
            owner = Owner.parse(name)
            assert owner is not None
            if not wanted(owner):
                continue
            try:
                self.client.api.remove_container(container_id, force=True, v=True)
            except docker.errors.NotFound:
                continue
            except docker.errors.APIError as exc:
                if refused_is_fine or "already in progress" in str(exc):  # another run is collecting it right now
                    continue
                raise
            removed.append(name)
        return removed

    @contextmanager
    def removed_on_term(self) -> Iterator[None]:
        """A block whose containers are made on other threads: a SIGTERM removes this process's
        containers and ends the run (exit 143); see signals.terminate_sweeps."""
        with terminate_sweeps(self.remove_own_containers):
            yield

    def remove_container(self, name_or_id: str) -> None:
        """Force-remove a container with its anonymous volumes; gone already is fine."""
        try:
            self.client.api.remove_container(name_or_id, force=True, v=True)
        except docker.errors.NotFound:
            pass

    def create_container(self, image_id: str, *, name: str, **options: Any) -> Any:
        """Create a container named `name`, networking off. If the call does not return (SIGTERM
        mid-call, a lost connection), the engine may still have made it: it is removed by name,
        since its id never arrived."""
        try:
            return self.client.containers.create(image_id, name=name, network_mode="none", **options)
        except BaseException:
            try:
                self.remove_container(name)
            except Exception:
                pass  # the original error says more
            raise

    # --- an image run with its own entrypoint -------------------------------------------
    @contextmanager
    def started(
        self, image_id: str, *, role: str, command: Sequence[str], env: Mapping[str, str], gpus: bool,
    ) -> Iterator[StartedContainer]:
        """Create and start a container of `image_id` (its own entrypoint, networking off);
        remove it when the block ends, however it ends (SIGTERM included)."""
        with removed_by_name(role, self.remove_container) as name:
            try:
                container = self.create_container(
                    image_id,
                    name=name,
                    command=list(command),
                    environment=dict(env),
                    device_requests=[docker.types.DeviceRequest(count=-1, capabilities=[["gpu"]])] if gpus else None,
                )
            except docker.errors.ImageNotFound as exc:
                raise TargetNotFound(f"image {image_id} not found on the engine at {self.host}") from exc
            handle = StartedContainer(container, image_id=image_id, gpus=gpus)
            with handle.engine_errors():
                container.start()
            yield handle


@contextmanager
def removed_by_name(role: str, remove: Callable[[str], None]) -> Iterator[str]:
    """A fresh name for a container of `role`, removed by it (`remove`) when the block ends,
    however it ends, unless DSPARK_PATCH_KEEP_CONTAINER=1 keeps it.

    The name is made first and the removal is by name: a SIGTERM (signals.py makes it
    SystemExit) that lands after the engine made the container but before its answer was held
    (create_container only covers its own call) still removes it, and one that lands during
    the removal waits for it to finish."""
    name = container_name(role)
    with terminate_raises() as term:
        try:
            yield name
        finally:
            if not keep_requested():
                with term.deferred():
                    remove(name)


class StartedContainer:
    """A running container of an image's own entrypoint: its id, its state, its log."""

    def __init__(self, container: Any, *, image_id: str, gpus: bool) -> None:
        self._container = container
        self.id: str = container.id
        self.image_id = image_id
        self._gpus = gpus

    def state(self) -> ContainerState:
        with self.engine_errors():
            self._container.reload()
        if self._container.status in ("running", "created", "restarting"):
            return ContainerState(running=True, exit_code=None)
        return ContainerState(running=False, exit_code=int(self._container.attrs["State"]["ExitCode"]))

    def logs(self) -> str:
        with self.engine_errors():
            raw = self._container.logs(stdout=True, stderr=True)
        return raw.decode("utf-8", "replace")

    @contextmanager
    def engine_errors(self) -> Iterator[None]:
        try:
            yield
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(
                f"could not run image {self.image_id}: {reason(exc)}",
                hint="a GPU run needs the NVIDIA container toolkit on the engine's host" if self._gpus else None,
            ) from exc


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


def reason(exc: BaseException) -> str:
    """The engine's own explanation of a failed call, for one-line messages."""
    if isinstance(exc, docker.errors.APIError) and exc.explanation:
        return str(exc.explanation)
    return str(exc).strip() or type(exc).__name__
