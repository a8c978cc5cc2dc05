"""Naming a result: a tag is set only while this run holds the engine's lock on that tag, and
only if the tag is still free (or the caller asked to move it).

The engine's tag call moves an existing tag silently, so "checked free, then set" is a race
between two runs that asked for the same tag: both would report it, and it would name one
image. The one thing an engine makes atomically is a container name (a second create of the
same name fails with a conflict), so a created, never-started container named after the tag is
the lock. It names its owner (host, pid, start time) in a label: a lock whose owner on this host
is gone, or that is older than any tag step, was left by a killed run and is taken over.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import docker.errors

from ...errors import EnvironmentProblem, TagExists, TagRace
from ...imageref import ImageRef
from .client import DockerEngine, reason
from .naming import Owner, container_name

LOCK_PREFIX = "dspark-patch-tag-lock--"
OWNER_LABEL = "io.github.dspark-patch.tag-lock.owner"
# A lock is held for two engine calls (inspect, tag). One older than this was left behind.
STALE_AFTER_S = 120.0
# --force-tag waits this long for another run's lock on the same tag.
FORCE_WAIT_S = 60.0


def lock_name(tag: str) -> str:
    """The lock's container name: one per tag as the engine spells it (`x` and `x:latest` are one)."""
    ref = ImageRef.parse(tag)
    canonical = f"{ref.name}:{ref.tag_or_latest}"
    return LOCK_PREFIX + hashlib.sha256(canonical.encode()).hexdigest()[:32]


def name_image(engine: DockerEngine, image_id: str, tag: str, *, force: bool) -> None:
    """Tag `image_id` as `tag`, under the tag's lock: a tag that another image holds by now is
    a TagRace (exit 2) unless `force`; an image that already holds it is left as it is."""
    with held(engine, image_id, tag, wait=force):
        if engine.tag_exists(tag):
            holder = engine.image_info(tag).id
            if holder == image_id:
                return
            if not force:
                raise TagRace(
                    f"tag {tag} appeared while this run worked: another run or person set it to {holder}",
                    hint="choose another --tag, or pass --force-tag to move it",
                )
        engine.tag(image_id, tag)


def refuse_taken(engine: DockerEngine, tag: str, *, force: bool) -> None:
    """Before any work: a tag that exists fails now (the check under the lock comes at the end)."""
    if engine.tag_exists(tag) and not force:
        raise TagExists(
            f"tag {tag} already exists ({engine.image_info(tag).id})",
            hint="choose another --tag, or pass --force-tag to move it to the patched image",
        )


@contextmanager
def held(engine: DockerEngine, image_id: str, tag: str, *, wait: bool) -> Iterator[None]:
    """The engine's lock on `tag` for the block. Without `wait`, a lock another live run holds is
    a TagRace; with it, that run is waited for (FORCE_WAIT_S)."""
    name = lock_name(tag)
    deadline = time.monotonic() + (FORCE_WAIT_S if wait else 0.0)
    api = engine.client.api
    while True:
        try:
            made = api.create_container(
                image_id, name=name, entrypoint=["/dspark-patch-tag-lock"], command=[],
                labels={OWNER_LABEL: container_name("tag-lock")}, network_disabled=True,
            )
            break
        except docker.errors.APIError as exc:
            if exc.status_code != 409:
                raise EnvironmentProblem(f"taking the engine's lock on the tag {tag} failed: {reason(exc)}") from None
        if _take_over_stale(engine, name):
            continue
        if time.monotonic() >= deadline:
            raise TagRace(
                f"another run is setting the tag {tag} right now",
                hint="choose another --tag, or pass --force-tag to wait for that run and move the tag",
            )
        time.sleep(0.2)
    try:
        yield
    finally:
        try:
            api.remove_container(made["Id"], force=True)
        except docker.errors.NotFound:
            pass


def remove_stale_locks(engine: DockerEngine) -> list[str]:
    """What `dspark-patch gc` adds: the tag locks killed runs left (their owner on this host is
    gone, or they are older than any tag step); their names."""
    removed = []
    for entry in engine.client.api.containers(all=True, filters={"name": LOCK_PREFIX}):
        for name in (n.lstrip("/") for n in entry.get("Names") or ()):
            if name.startswith(LOCK_PREFIX) and _take_over_stale(engine, name):
                removed.append(name)
    return removed


def _take_over_stale(engine: DockerEngine, name: str) -> bool:
    """Remove the lock `name` if a killed run left it; True when it is gone (removed, or released
    meanwhile), False while its owner may still hold it."""
    api = engine.client.api
    try:
        info = api.inspect_container(name)
    except docker.errors.NotFound:
        return True
    owner = Owner.parse(((info.get("Config") or {}).get("Labels") or {}).get(OWNER_LABEL, ""))
    gone = owner is not None and owner.here and not owner.alive()
    if not gone and not _older_than(info.get("Created"), STALE_AFTER_S):
        return False
    try:
        api.remove_container(info["Id"], force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError:
        return False  # another run is taking it over right now
    return True


def _older_than(created: object, seconds: float) -> bool:
    if not isinstance(created, str):
        return True
    try:
        # The engine's RFC 3339 with nanoseconds: seconds are enough here.
        when = datetime.fromisoformat(created.split(".")[0].rstrip("Z")).replace(tzinfo=UTC)
    except ValueError:
        return True
    return (datetime.now(UTC) - when).total_seconds() > seconds
