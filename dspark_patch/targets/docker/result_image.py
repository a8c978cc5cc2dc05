"""The patched image: one layer on top of the source, the source's config kept, then checked.

The layer is a tar the tool made (the patched files, their bytecode and the folders above them,
as they are in the work container) and the image is built from it (append.py), never committed
from a container: nothing an engine writes into containers can reach it, and the config is the
source's by construction. `check_result` stays as a cheap check before anything is tagged.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from ...errors import CheckFailed, LayerMismatch
from ..base import CommittedImage
from .append import append_layer
from .client import DockerEngine, ImageInfo

# Python run as root in an image without precompiled stdlib writes
# /usr/lib/python3.X/__pycache__/*.pyc: every python we run gets `-B` (the work container is
# never committed, but reads of it should see the image as it is).
KEEPALIVE = "import time\nwhile True: time.sleep(3600)"

# Config fields a commit must carry over from the source unchanged (Labels: plus ours).
CONFIG_FIELDS = (
    "Entrypoint", "Cmd", "User", "WorkingDir", "Env", "ExposedPorts", "Volumes", "Labels",
    "StopSignal", "Healthcheck", "Shell", "OnBuild", "ArgsEscaped",
)


def keepalive_argv(python: str) -> list[str]:
    """The work container's entrypoint: it only has to stay up while the tool execs into it."""
    return [python, "-B", "-c", KEEPALIVE]


def build_result(
    engine: DockerEngine, source: ImageInfo, layer: bytes, *, labels: Mapping[str, str],
) -> CommittedImage:
    """`source` plus `layer` with the source's config and `labels` added, untagged: a name is
    given last (tag_lock.name_image), once the run's reports are written. An image that fails
    its check (layers, config field by field) is removed."""
    expected = copy.deepcopy(dict(source.config))
    expected["Labels"] = {**(expected.get("Labels") or {}), **labels}
    image_id = append_layer(engine, source, layer, expected)
    try:
        result = engine.image_info(image_id)
        check_result(source, result, expected)
    except BaseException:
        engine.remove_image(image_id, force=True)
        raise
    return CommittedImage(ref=result.id, id=result.id, layers=result.layers)


def check_result(source: ImageInfo, result: ImageInfo, expected: Mapping[str, Any]) -> None:
    if result.layers != source.layers + 1 or result.diff_ids[:-1] != source.diff_ids:
        raise LayerMismatch(
            f"the committed image has {result.layers} layers, expected {source.layers} + 1",
            hint="nothing was tagged; report this: the engine did not add exactly one layer",
        )
    differing = []
    for field in CONFIG_FIELDS:
        want, got = expected.get(field), result.config.get(field)
        if want != got and not (_unset(want) and _unset(got)):
            differing.append(f"{field}: {want!r} became {got!r}")
    if differing:
        raise CheckFailed(
            "the committed image's config differs from the source's: " + "; ".join(differing),
            hint="nothing was tagged; report this as a bug with the audit report",
        )


def _unset(value: Any) -> bool:
    """An absent field and its zero value mean the same to the engine: a source with no config
    at all is inspected as null, and the same config with only our labels as `User: ""`."""
    return value in (None, "", [], {})
