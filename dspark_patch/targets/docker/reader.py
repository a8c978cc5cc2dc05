"""A read-only view of an image: its files, read through the engine, without running anything.

`ImageReader` creates one container from the image and never starts it (no entrypoint, no
code of the image runs, so a foreign platform needs no emulation and an image without Python
can be read), with networking off and a name of our scheme (`gc` knows it). It is removed on
every path. Nothing else changes on the engine: no image, no tag, no container is left.

Design, from measurements on the ~2 GB fixture (vLLM 877 MB + torch 754 MB in one site
folder), on a loaded 2-core machine (`bench/status_fleet.py` prints the current figures):
- Finding the site folder: `HEAD /containers/ID/archive` returns only the path-stat header,
  a few ms per path. The site folder is the one the image's interpreters import from
  (targets/views/site_folders.py: the interpreters `apply` finds, their sys.path derived from prefix and
  version), the same rule as the layer route; the old sweep of the usual prefixes over
  python3.6 … 3.14 only names a copy that no interpreter imports.
- Reading: the archive API cannot list a folder without sending all of it, and the check
  needs (a) every byte of the distribution's own folders (RECORD integrity) and (b) the
  site folder's top-level names and every distribution's RECORD (unlisted `.pth` files).
  One tar stream of the site folder, parsed as it arrives by the strict layer reader, hashing
  only the distribution's members and keeping only top-level names and RECORDs, serves both
  in one round trip. Streaming the vLLM folder alone costs about half (it is half the bytes),
  but then (b) would need the same full stream again.
- Many images: the work is the engine producing tar and us hashing it; images with the same
  id are read once, the rest concurrently (`status.fleet`).
"""

from __future__ import annotations

import base64
import io
import json
import posixpath
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any, BinaryIO

import docker.errors
import requests.exceptions

from ...distname import filename_name
from ...errors import (
    EnvironmentProblem,
    TargetNotFound,
    UnreadableLayout,
    runs_first_message,
)
from ...references.installer import SCRIPT_CAP
from .. import imageconfig, interpreter
from ..layers import TarStream
from ..runtime import runs_first
from ..views.from_layers import folder_view, pth_in, site_files
from ..views.site_files import SiteFiles
from ..views.site_folders import choose_site, interpreter_sites

# Our container naming is shared with `gc`; the lead moves these into targets/docker/ at merge.
from .client import DockerEngine
from .client import reason as _reason
from .naming import container_name as _container_name
from .signals import terminate_raises

# Never started; only named so an accidental start fails fast instead of running the image.
NEVER_STARTED = ["/dspark-patch-status-never-starts"]


class ChunkReader(io.RawIOBase):
    """A file object over the engine's response chunks, for tarfile's stream mode."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(buffer), len(self._buffer))
        buffer[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n


class ImageReader:
    """Use as a context manager; `read_site(distribution)` returns a `SiteFiles`."""

    def __init__(self, ref: str, *, engine: DockerEngine, platform: str | None = None, image_id: str | None = None) -> None:
        self.ref = ref
        self._wanted = image_id or ref  # an id pins exactly the image a fleet run grouped tags by
        self.platform = platform
        self._engine = engine
        self._api = engine.client.api
        self._container: str | None = None
        self._name: str | None = None     # set before the create: what to remove if its answer is lost
        self._term = terminate_raises()
        self.image_id: str | None = None
        self.image_platform: str | None = None
        self._config: dict[str, Any] = {}

    def __enter__(self) -> ImageReader:
        info = self._engine.image_info(self._wanted)
        self.image_id, self._config = info.id, info.config
        self.image_platform = info.platform
        # As a work container's (container.py): the name is made first and the removal is by
        # name, on every way out of the entry too, so a SIGTERM wherever it lands (the main
        # thread; a fleet's readers are swept by `DockerEngine.removed_on_term`) leaves none.
        self._term.__enter__()
        self._name = _container_name("status")
        try:
            try:
                created = self._api.create_container(
                    info.id, entrypoint=NEVER_STARTED, command=[], name=self._name,
                    network_disabled=True, host_config=self._api.create_host_config(network_mode="none"),
                    platform=self.platform,
                )
            except docker.errors.APIError as exc:
                raise EnvironmentProblem(f"could not create a container from image {self.ref}: {_reason(exc)}") from exc
            self._container = created["Id"]
            return self
        except BaseException:
            self._leave(quiet=True)
            raise

    def __exit__(self, *exc: object) -> None:
        self._leave()

    def _leave(self, *, quiet: bool = False) -> None:
        """Remove the container by its name (held or not; gone already is fine), then give
        SIGTERM back. `quiet`: the error that ended the entry says more than the removal's."""
        try:
            if self._name is not None:
                with self._term.deferred():  # a SIGTERM now would leave it: the removal finishes first
                    try:
                        self._api.remove_container(self._name, force=True, v=True)
                    except docker.errors.NotFound:
                        pass
                    except Exception:
                        if not quiet:
                            raise
                    self._name, self._container = None, None
        finally:
            self._term.__exit__(None, None, None)

    # --- the archive API --------------------------------------------------------------------
    def stat(self, path: str) -> dict[str, Any] | None:
        """The engine's path-stat of `path` in the image (name, size, mode, linkTarget), or None."""
        assert self._container
        url = engine_url(self._api, f"/containers/{self._container}/archive")
        try:
            response = self._api.head(url, params={"path": path})
        except requests.exceptions.RequestException as exc:
            raise EnvironmentProblem(f"reading image {self.ref} failed: {exc}") from exc
        if response.status_code == 404:
            return None
        if response.status_code >= 400:
            raise EnvironmentProblem(f"reading {path} in image {self.ref} failed: HTTP {response.status_code}")
        header = response.headers.get("X-Docker-Container-Path-Stat")
        if not header:
            return None
        return json.loads(base64.b64decode(header))

    def is_dir(self, path: str) -> bool:
        found = self.stat(path)
        return imageconfig.is_dir(found)

    def _chunks(self, path: str) -> BinaryIO:
        assert self._container
        try:
            chunks, _ = self._api.get_archive(self._container, path, chunk_size=1 << 20)
        except docker.errors.NotFound:
            raise TargetNotFound(f"{path} vanished from image {self.ref}") from None
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"reading {path} in image {self.ref} failed: {_reason(exc)}") from exc
        return io.BufferedReader(ChunkReader(chunks), 1 << 20)

    def read_small(self, path: str, limit: int = 1 << 16) -> bytes | None:
        """A small regular file's bytes (pyvenv.cfg, a script's `#!` line), None otherwise."""
        if not interpreter.is_small_file(self.stat(path), limit):
            return None
        stream = TarStream(self._chunks(path), where=f"the engine's tar of {path} in image {self.ref}")
        for member in stream:
            return stream.read_all(limit) if member.kind == "file" else None
        return None

    # --- locating ----------------------------------------------------------------------------
    def site_candidates(self) -> list[str]:
        """Every site folder at the usual places (only to name a copy no interpreter imports)."""
        return imageconfig.site_candidates(self._config, self.is_dir)

    def read_site(self, distribution: str, *, retain: Iterable[str] = ()) -> SiteFiles:
        """The site folder the image's interpreters import `distribution` from (targets/views/site_folders.py,
        the same rule as the layer route), read through the engine without running anything."""
        top = filename_name(distribution)

        def read_head(path: str) -> bytes | None:
            data = self.read_small(path)
            return data[:512] if data is not None else None

        def holds(site: str) -> bool:
            found = self.stat(f"{site}/{top}")
            if imageconfig.is_link(found):
                raise UnreadableLayout(f"{site}/{top} in image {self.ref} is a symlink: status reads no files through "
                                       f"links in {distribution}'s folders", hint="nothing is said about this image")
            return self.stat(f"{site}/{top}/__init__.py") is not None

        def everywhere() -> list[str]:
            return [s for s in self.site_candidates() if self.stat(f"{s}/{top}/__init__.py") is not None]

        paths = interpreter_sites(self._config, self.stat, read_head, self.read_small)
        chosen, site = choose_site(self.ref, distribution, paths, holds, everywhere)
        found = self._read(site, distribution, retain)
        first = runs_first(self._config, self.stat, self.read_small, site=site, python=found.python or chosen.python,
                           distribution=distribution, sites=chosen.sites,
                           pth_files=lambda folder: self._pth_files(folder, distribution))
        if first:
            raise runs_first_message(self.ref, distribution, first)
        others = tuple(s for s in everywhere() if s != site)
        return replace(found, python=found.python or chosen.python, unimported=others)

    def _read(self, site: str, distribution: str, retain: Iterable[str] = ()) -> SiteFiles:
        # A site folder reached through a link is read where the link leads (dockerd's stat gives
        # the target resolved in the container); the archive's names start with the folder's name.
        stat = self.stat(site) or {}
        real = str(stat.get("linkTarget") or site) if imageconfig.is_link(stat) else site
        view = folder_view(self._chunks(real), folder=real, distribution=distribution,
                           where=f"the engine's tar of {real} in image {self.ref}", retain=retain)
        found = site_files(view, distribution, real)
        if found is None:
            raise TargetNotFound(f"{site}/{filename_name(distribution)} in image {self.ref} has no {distribution} dist-info "
                                 "(METADATA, RECORD)",
                                 hint="the package was not installed as a distribution; nothing to check it against")
        # The folder's tar holds no console script outside it: each is read through the engine.
        scripts = {row: self._script(posixpath.normpath(posixpath.join(real, row))) for row in found.scripts}
        return replace(found, location=site, scripts=scripts)

    def _pth_files(self, folder: str, distribution: str) -> dict[str, bytes | None] | None:
        """The `.pth` files right in another site folder (targets/runtime.py `pth_first`), from
        the engine's tar of that folder, read by the strict reader as the site folder is."""
        stat = self.stat(folder)
        if stat is None:
            return None
        real = str(stat.get("linkTarget") or folder) if imageconfig.is_link(stat) else folder
        if not imageconfig.is_dir(self.stat(real)):
            return None
        view = folder_view(self._chunks(real), folder=real, distribution=distribution,
                           where=f"the engine's tar of {real} in image {self.ref}")
        return pth_in(view, real)

    def _script(self, path: str) -> bytes | str | None:
        """A console script as the engine's path-stat and archive give it (references.ScriptBytes)."""
        found = self.stat(path)
        if found is None:
            return None
        if imageconfig.is_link(found):
            return "a symlink"
        if int(found.get("mode", 0)) & imageconfig.GO_TYPE:
            return "not a regular file"
        if int(found.get("size", 0)) > SCRIPT_CAP:
            return f"over {SCRIPT_CAP} bytes"
        data = self.read_small(path, SCRIPT_CAP)
        return data if data is not None else "not read"


def engine_url(api: docker.APIClient, path: str) -> str:
    # docker-py's APIClient is a requests.Session whose adapters speak to the engine (unix socket,
    # TCP or SSH); it has no public call for HEAD of the archive endpoint (a path's stat without
    # its contents) or for saving several images in one stream, so those two requests are built
    # from its public attributes and sent with the Session's own public methods.
    return f"{api.base_url}/v{api.api_version}{path}"
