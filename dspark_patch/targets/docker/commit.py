"""Committing a work container as exactly one layer on top of its source, config kept.

The trap (seen on a real engine): a commit fills every field its config leaves empty from the
container's config, so anything set on the container (env, user, entrypoint, labels) can leak
into the image. Hence env and user are given per exec (container.py), the commit is handed the
source's whole config, and the keep-alive is placed where the source config already has a
value (`keepalive_config`). The result is checked field by field before anything is tagged.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ...errors import CheckFailed, LayerMismatch, TagExists
from ..base import CommittedImage
from .container import WorkContainer
from .engine import DockerEngine, ImageInfo

# Python run as root in an image without precompiled stdlib writes
# /usr/lib/python3.X/__pycache__/*.pyc into the layer: every python we run gets `-B`.
KEEPALIVE = "import time\nwhile True: time.sleep(3600)"

# Config fields a commit must carry over from the source unchanged (Labels: plus ours).
CONFIG_FIELDS = (
    "Entrypoint", "Cmd", "User", "WorkingDir", "Env", "ExposedPorts", "Volumes", "Labels",
    "StopSignal", "Healthcheck", "Shell", "OnBuild", "ArgsEscaped",
)


def keepalive_config(source: Mapping[str, Any], python: str) -> dict[str, Any]:
    """Entrypoint/command for the keep-alive container, placed so a commit cannot leak them.

    With a source ENTRYPOINT the keep-alive replaces the entrypoint, and the commit restores it
    and leaves CMD as the source has it (null stays null). Without one, the keep-alive is the
    command and the entrypoint is left unset (the image's own: null or []), so the commit
    restores the source's CMD and its entrypoint exactly. Only an image with neither cannot
    be committed exactly (the keep-alive would become its CMD); `check_commit` refuses it."""
    argv = [python, "-B", "-c", KEEPALIVE]
    if source.get("Entrypoint"):
        return {"entrypoint": argv, "command": None}
    return {"command": argv}


def refuse_existing_tag(engine: DockerEngine, tag: str, *, force: bool) -> None:
    if engine.tag_exists(tag) and not force:
        raise TagExists(
            f"tag {tag} already exists ({engine.image_info(tag).id})",
            hint="choose another --tag, or pass --force to move it to the patched image",
        )


def commit(
    engine: DockerEngine, container: WorkContainer, source: ImageInfo, *,
    labels: Mapping[str, str], tag: str | None, force: bool,
) -> CommittedImage:
    """One new layer on top of `source` with the source's config and `labels` added.

    Nothing is tagged unless the result is verified (layers, config field by field); an
    unverified image is removed."""
    if tag:
        refuse_existing_tag(engine, tag, force=force)
    expected = copy.deepcopy(dict(source.config))
    expected["Labels"] = {**(expected.get("Labels") or {}), **labels}
    image_id = container.commit_layer(expected)
    try:
        result = engine.image_info(image_id)
        check_commit(source, result, expected)
        if tag:
            engine.tag(result.id, tag)
    except BaseException:
        engine.remove_image(image_id, force=True)
        raise
    return CommittedImage(ref=tag or result.id, id=result.id, layers=result.layers)


def check_commit(source: ImageInfo, result: ImageInfo, expected: Mapping[str, Any]) -> None:
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
