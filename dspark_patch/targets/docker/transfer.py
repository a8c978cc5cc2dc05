"""Pulls and pushes through the engine, with the login of the standard docker config.

The SDK reads credentials the way the docker CLI stores them (`docker login`, `DOCKER_CONFIG`,
credential helpers) and hands them to the engine per call; nothing here reads passwords. What
comes back is a stream of JSON events: `pull` turns them into `PullProgress` events for whoever
shows them (only `cli/` prints), and any error into one line saying what to fix — a refused
login names the registry, the config file and `docker login`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import docker
import docker.auth
import docker.errors
import docker.utils.config
import requests.exceptions
import urllib3.exceptions

from ...errors import BadInput, DsparkPatchError, EnvironmentProblem, TargetNotFound
from ...imageref import ImageRef
from ...registry.index import docker_config_file
from ..base import PullCallback, PullProgress

_REFUSED = re.compile(r"unauthori[sz]ed|authentication required|no basic auth credentials|denied", re.I)
_ABSENT = re.compile(r"manifest unknown|not found|does not exist|name unknown", re.I)


def is_image_id(ref: str) -> bool:
    """An image id (full or short) names an image on this engine only: there is nothing to pull."""
    return ImageRef.is_image_id(ref)


def pull_image(api: docker.APIClient, ref: str, *, platform: str | None = None,
               on_progress: PullCallback | None = None) -> None:
    """Pull `ref` (name:tag or name@sha256:…) from its registry with the docker config's login."""
    name = ImageRef.parse(ref)
    try:
        # The low-level call: the high-level `images.pull` drops the stream's error events. The
        # engine takes a digest in place of the tag (and pulls by digest when both are given).
        events = api.pull(name.name, tag=name.digest or name.tag_or_latest, platform=platform,
                                        stream=True, decode=True)
        _follow(ref, events, on_progress)
    except DsparkPatchError:
        raise
    except docker.errors.APIError as exc:
        raise registry_error("pulling", ref, _explain(exc), not_found_is_input=True) from None
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as exc:
        # urllib3's errors come through unwrapped while the SDK reads the event stream (a read
        # timeout of the engine's answer, say).
        raise EnvironmentProblem(f"pulling {ref} failed: {exc}") from None
    if on_progress is not None:
        on_progress(PullProgress(ref=ref, layer=None, status="pulled", done=True))


def _follow(ref: str, events: Iterable[dict[str, Any]], on_progress: PullCallback | None) -> None:
    for event in events:
        if "error" in event:
            raise registry_error("pulling", ref, str(event["error"]), not_found_is_input=True)
        if on_progress is None or "status" not in event:
            continue
        detail = event.get("progressDetail") or {}
        on_progress(PullProgress(ref=ref, layer=event.get("id") if _is_layer(event) else None,
                                 status=str(event["status"]), current=detail.get("current"),
                                 total=detail.get("total")))


def _is_layer(event: dict[str, Any]) -> bool:
    # "Pulling from repo" carries the tag as its id; layer steps carry a 12-hex layer id.
    return bool(re.fullmatch(r"[0-9a-f]{12}", str(event.get("id", ""))))


def push_image(api: docker.APIClient, tag: str) -> str:
    """Push `tag` to its registry with the docker config's login; returns the manifest digest."""
    name = ImageRef.parse(tag)
    digest = None
    try:
        for event in api.push(name.name, tag=name.tag_or_latest, stream=True, decode=True):
            if "error" in event:
                raise registry_error("pushing", tag, str(event["error"]), not_found_is_input=False)
            digest = (event.get("aux") or {}).get("Digest", digest)
            # Podman's compatible API reports the digest only in the status line
            # ("TAG: digest: sha256:... size: N"), never as `aux`.
            status = str(event.get("status") or "")
            if digest is None and ": digest: sha256:" in status:
                digest = status.split(": digest: ", 1)[1].split()[0]
    except DsparkPatchError:
        raise
    except docker.errors.APIError as exc:
        raise registry_error("pushing", tag, _explain(exc), not_found_is_input=False) from None
    except (requests.exceptions.RequestException, urllib3.exceptions.HTTPError) as exc:
        raise EnvironmentProblem(f"pushing {tag} failed: {exc}",
                                 hint="the engine stopped answering while it pushed; check it and the registry") from None
    if digest is None:
        raise EnvironmentProblem(f"pushing {tag} reported no digest")
    return str(digest)


def registry_error(doing: str, ref: str, said: str, *, not_found_is_input: bool) -> DsparkPatchError:
    """One line for a failed pull or push: a refused login (exit 3, naming the registry, the
    config file and `docker login`), an image the registry lacks (exit 2), anything else (exit 3)."""
    registry = ImageRef.host_of(ref) or docker.auth.INDEX_NAME
    said = said.strip()
    if _REFUSED.search(said):
        config = docker.utils.config.find_config_file() or docker_config_file()
        stored = docker.auth.load_config().resolve_authconfig(registry)
        whose = (f"refused the credentials for it in {config}" if stored
                 else f"asks for a login and {config} has none for it")
        return EnvironmentProblem(f"{doing} {ref} failed: the registry {registry} {whose} ({said})",
                                  hint=f"run `docker login {registry}` (or point DOCKER_CONFIG at a folder that has the login)")
    if not_found_is_input and _ABSENT.search(said):
        return TargetNotFound(f"image {ref} is neither on the engine nor in its registry {registry}: {said}",
                              hint="check the name and tag (`docker images`, the registry's catalog)")
    if "invalid reference" in said.lower():
        return BadInput(f"image reference {ref!r} is not usable: {said}")
    return EnvironmentProblem(f"{doing} {ref} failed: {said}",
                              hint=f"check that the registry {registry} is running and reachable from the engine")


def _explain(exc: docker.errors.APIError) -> str:
    return str(exc.explanation or exc).strip()
