"""A read-only view of an image: its files, read through the engine, without running anything.

`ImageReader` creates one container from the image and never starts it (no entrypoint, no
code of the image runs, so a foreign platform needs no emulation and an image without Python
can be read), with networking off and a name of our scheme (`gc` knows it). It is removed on
every path. Nothing else changes on the engine: no image, no tag, no container is left.

Design, from measurements on the ~2 GB fixture (vLLM 877 MB + torch 754 MB in one site
folder), on a loaded 2-core machine (`bench/status_fleet.py` prints the current figures):
- Finding the site folder: `HEAD /containers/ID/archive` returns only the path-stat header,
  a few ms per path. Candidates: the site folders of every `…/bin` on the image's PATH and of
  VIRTUAL_ENV, then common prefixes (/usr/local, /usr, /opt/conda, /opt/venv …) over
  python3.6 … 3.14. First the `lib/python3.X` folders, then their site/dist-packages.
- Reading: the archive API cannot list a folder without sending all of it, and the check
  needs (a) every byte of the distribution's own folders (RECORD integrity) and (b) the
  site folder's top-level names and every distribution's RECORD (unlisted `.pth` files).
  One tar stream of the site folder, parsed as it arrives (`tarfile` mode "r|"), hashing
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
import re
import tarfile
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import docker.errors
import requests.exceptions

from ...errors import EnvironmentProblem, TargetNotFound
from ..layerfs import Entry, LayerIndexer, merge, site_files
from ..sitefiles import SiteFiles

# Our container naming is shared with `gc`; the lead moves these into targets/docker/ at merge.
from .engine import DockerEngine
from .engine import reason as _reason
from .naming import container_name as _container_name

PYTHON_MINORS = tuple(range(14, 5, -1))   # newest first: 3.14 … 3.6
COMMON_PREFIXES = ("/usr/local", "/usr", "/opt/conda", "/opt/venv", "/venv", "/opt/python")
# Never started; only named so an accidental start fails fast instead of running the image.
NEVER_STARTED = ["/dspark-patch-status-never-starts"]
_PY_DIR = re.compile(r"/python(3\.\d+)/")


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


class _ChunkReader(io.RawIOBase):
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
        self.image_id: str | None = None
        self.image_platform: str | None = None
        self._config: dict[str, Any] = {}

    def __enter__(self) -> ImageReader:
        info = self._engine.image_info(self._wanted)
        self.image_id, self._config = info.id, info.config
        attrs = self._engine.client.images.get(info.id).attrs
        parts = [attrs.get("Os") or "linux", attrs.get("Architecture") or "", attrs.get("Variant") or ""]
        self.image_platform = "/".join(p for p in parts if p)
        try:
            created = self._api.create_container(
                info.id, entrypoint=NEVER_STARTED, command=[], name=_container_name("status"),
                network_disabled=True, host_config=self._api.create_host_config(network_mode="none"),
                platform=self.platform,
            )
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"could not create a container from image {self.ref}: {_reason(exc)}") from exc
        self._container = created["Id"]
        return self

    def __exit__(self, *exc: object) -> None:
        container, self._container = self._container, None
        if container is not None:
            try:
                self._api.remove_container(container, force=True, v=True)
            except docker.errors.NotFound:
                pass

    # --- the archive API --------------------------------------------------------------------
    def stat(self, path: str) -> dict[str, Any] | None:
        """The engine's path-stat of `path` in the image (name, size, mode, linkTarget), or None."""
        assert self._container
        url = _engine_url(self._api, f"/containers/{self._container}/archive")
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
        return found is not None and bool(found.get("mode", 0) & (1 << 31))  # Go's os.ModeDir

    def _stream(self, path: str) -> tarfile.TarFile:
        assert self._container
        try:
            chunks, _ = self._api.get_archive(self._container, path, chunk_size=1 << 20)
        except docker.errors.NotFound:
            raise TargetNotFound(f"{path} vanished from image {self.ref}") from None
        except docker.errors.APIError as exc:
            raise EnvironmentProblem(f"reading {path} in image {self.ref} failed: {_reason(exc)}") from exc
        return tarfile.open(fileobj=io.BufferedReader(_ChunkReader(chunks), 1 << 20), mode="r|", bufsize=1 << 20)

    # --- locating ----------------------------------------------------------------------------
    def site_candidates(self) -> list[str]:
        """Site folders that exist in the image, in the order an interpreter on PATH would see them."""
        env = dict(e.split("=", 1) for e in self._config.get("Env") or () if "=" in e)
        prefixes: list[str] = []
        for entry in [env.get("VIRTUAL_ENV", "") + "/bin", *env.get("PATH", "").split(":")]:
            if entry.endswith("/bin") and entry != "/bin":
                prefixes.append(posixpath.dirname(entry) or "/")
        prefixes += COMMON_PREFIXES
        found: list[str] = []
        seen: set[str] = set()
        for prefix in prefixes:
            if prefix in seen or prefix == "/":
                continue
            seen.add(prefix)
            for minor in PYTHON_MINORS:
                lib = f"{prefix}/lib/python3.{minor}"
                if not self.is_dir(lib):
                    continue
                for name in ("site-packages", "dist-packages"):
                    if self.is_dir(f"{lib}/{name}"):
                        found.append(f"{lib}/{name}")
            if prefix == "/usr" and self.is_dir("/usr/lib/python3/dist-packages"):
                found.append("/usr/lib/python3/dist-packages")  # Debian's python3-* packages
        return found

    def _python_for(self, site: str) -> str | None:
        found = _PY_DIR.search(site + "/")
        if found:
            return found.group(1)
        for minor in PYTHON_MINORS:  # /usr/lib/python3/dist-packages: whichever python3.X is there
            if self.stat(f"/usr/bin/python3.{minor}") is not None:
                return f"3.{minor}"
        return None

    def read_site(self, distribution: str, *, keep: Iterable[str] = ()) -> SiteFiles:
        top = _normalize(distribution)
        for site in self.site_candidates():
            if self.stat(f"{site}/{top}") is not None:
                return self._read(site, distribution, keep)
        raise TargetNotFound(f"no {distribution} in image {self.ref} (looked in the site folders of its PATH "
                             f"and the usual prefixes)", hint=f"list images that have {distribution} installed")

    def _read(self, site: str, distribution: str, keep: Iterable[str] = ()) -> SiteFiles:
        # The archive's names start with the folder's own name: index them under its parent.
        with self._stream(site) as tar:
            view = merge([LayerIndexer(distribution, keep=keep).index(tar, prefix=posixpath.dirname(site))])
        found = site_files(view, distribution, prefer=[site])
        if found is None:
            raise TargetNotFound(f"{site}/{_normalize(distribution)} in image {self.ref} has no {distribution} dist-info "
                                 "(METADATA, RECORD)",
                                 hint="the package was not installed as a distribution; nothing to check it against")
        return found if found.python else replace(found, python=self._python_for(site))


def _engine_url(api: docker.APIClient, path: str) -> str:
    # docker-py's APIClient is a requests.Session whose adapters speak to the engine (unix socket,
    # TCP or SSH); it has no public call for HEAD of the archive endpoint (a path's stat without
    # its contents) or for saving several images in one stream, so those two requests are built
    # from its public attributes and sent with the Session's own public methods.
    return f"{api.base_url}/v{api.api_version}{path}"


def save_views(engine: DockerEngine, image_ids: Sequence[str], distribution: str,
               keep: Iterable[str] = ()) -> dict[str, dict[str, Entry]]:
    """Every image's merged view from ONE `docker save` of all of them (shared layers come once).

    Nothing is created on the engine. Layers are indexed as they stream past (their order in
    the archive is the engine's); manifest.json says which layers, bottom first, make which image."""
    api = engine.client.api
    try:
        # docker-py saves one image per call; the engine's endpoint takes many names at once.
        response = api.get(_engine_url(api, "/images/get"), params={"names": list(image_ids)}, stream=True)
    except requests.exceptions.RequestException as exc:
        raise EnvironmentProblem(f"reading the images' layers failed: {exc}") from exc
    if response.status_code >= 400:
        raise EnvironmentProblem(f"reading the images' layers failed: HTTP {response.status_code} {response.text.strip()[:200]}")
    indexer = LayerIndexer(distribution, keep=keep)
    layers: dict[str, dict[str, Entry]] = {}
    # A layer the archive already holds under another folder is written as a symlink to it
    # (dockerd does this when a layer is the top of one image and a lower layer of another).
    aliases: dict[str, str] = {}
    manifest: list[dict[str, Any]] = []
    try:
        stream = io.BufferedReader(_ChunkReader(response.iter_content(1 << 20)), 1 << 20)
        with tarfile.open(fileobj=stream, mode="r|", bufsize=1 << 20) as outer:
            for member in outer:
                if member.issym():
                    aliases[member.name] = posixpath.normpath(posixpath.join(posixpath.dirname(member.name), member.linkname))
                    continue
                if not member.isfile():
                    continue
                fh = outer.extractfile(member)
                assert fh is not None
                if member.name == "manifest.json":
                    manifest = json.loads(fh.read())
                    continue
                try:  # layers (plain or gzip); configs and OCI manifests are JSON and fail here
                    inner = tarfile.open(fileobj=fh, mode="r|*", bufsize=1 << 20)
                except tarfile.TarError:
                    continue
                with inner:
                    layers[member.name] = indexer.index(inner)
    except (tarfile.TarError, requests.exceptions.RequestException) as exc:
        raise EnvironmentProblem(f"reading the images' layers failed: {exc}") from exc
    finally:
        response.close()
    for alias, target in aliases.items():
        if target in layers:
            layers[alias] = layers[target]
    views = {}
    for entry in manifest:
        config = posixpath.basename(entry.get("Config", "")).removesuffix(".json")
        image_id = next((i for i in image_ids if i.removeprefix("sha256:") == config), None)
        names = entry.get("Layers") or ()
        # An image whose layer is missing from the archive gets no view (its row says so)
        # rather than a view that silently lacks that layer's files.
        if image_id is not None and all(name in layers for name in names):
            views[image_id] = merge(layers[name] for name in names)
    return views


def preferred_sites(config: dict[str, Any]) -> list[str]:
    """Site folders in the order the image's PATH (and VIRTUAL_ENV) would reach them."""
    env = dict(e.split("=", 1) for e in config.get("Env") or () if "=" in e)
    sites = []
    for entry in [env.get("VIRTUAL_ENV", "") + "/bin", *env.get("PATH", "").split(":")]:
        if entry.endswith("/bin") and entry != "/bin":
            prefix = posixpath.dirname(entry)
            for minor in PYTHON_MINORS:
                sites += [f"{prefix}/lib/python3.{minor}/site-packages", f"{prefix}/lib/python3.{minor}/dist-packages"]
    return [*sites, "/usr/lib/python3/dist-packages"]

