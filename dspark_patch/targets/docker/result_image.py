"""The patched image: one layer on top of the source, the source's config kept, then checked.

The layer is a tar the tool made (the patched files, their bytecode and the folders above them,
as they are in the work container) and the image is built from it (append.py), never committed
from a container: nothing an engine writes into containers can reach it, and the config is the
source's by construction. `check_result` stays as a cheap check before anything is tagged.
`ResultImage` holds what a run made and names it last (tag_lock.py), pushes it, or takes it
back; it also names a source that already carries the patch.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import docker.errors

from ...errors import CheckFailed, DsparkPatchError, LayerMismatch, TagRace
from ..base import CommittedImage
from . import tag_lock
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


class ResultImage:
    """What an image target makes and names in the engine: the result `commit` builds from the
    source and the new layer, its tag (set last, under the tag's lock), its removal when the run
    fails after the commit, its push; or the source itself named, when it already carries the
    patch. What the engine keeps despite a removal goes into the target's notes."""

    def __init__(self, engine: DockerEngine, source: ImageInfo, notes: list[str]) -> None:
        self._engine = engine
        self._source = source
        self._notes = notes                          # the target's: its closing notes say them
        self._result: CommittedImage | None = None   # what commit() made, until discard()

    def commit(self, layer: bytes, *, labels: Mapping[str, str]) -> CommittedImage:
        """`layer` on top of the source with the source's config and `labels` added, untagged
        (build_result: nothing stays unless it is verified)."""
        self._result = build_result(self._engine, self._source, layer, labels=labels)
        return self._result

    def name(self, tag: str, *, force: bool) -> CommittedImage:
        """Tag the committed result, last, under the engine's lock on the tag (tag_lock.py)."""
        assert self._engine and self._result is not None
        tag_lock.name_image(self._engine, self._result.id, tag, force=force)
        self._result = replace(self._result, ref=tag)
        return self._result

    def discard(self) -> str | None:
        """The run failed after the commit: its result goes (this run's tag first, if it set one
        and the tag still names the result; another name keeps the image, as `docker rmi` would)."""
        assert self._engine
        result, self._result = self._result, None
        if result is None:
            return None
        if result.ref != result.id and self._engine.tag_exists(result.ref) \
                and self._engine.image_info(result.ref).id == result.id:
            self._engine.untag(result.ref)
        try:
            self._engine.remove_image(result.id)
        except docker.errors.APIError:
            self._notes.append(f"the image {result.id} this run made stays: another name or container refers to it")
            return None
        return result.id

    def push(self, tag: str) -> str:
        """Push a tag (e.g. the committed result) to its registry; returns the manifest digest,
        read back from the registry: registries have no conditional put, so a digest that differs
        there is another push that moved the tag meanwhile (TagRace).

        A failed push leaves no name behind: the tag is removed, and with it the committed image
        unless another name refers to it (the engine's own rule for `docker rmi TAG`)."""
        assert self._engine
        try:
            digest = self._engine.push(tag)
            there = self._engine.registry_digest(tag)
            if there is None:
                self._notes.append(f"the registry's digest of {tag} could not be read back after the push")
            elif there != digest:
                raise TagRace(f"the registry's {tag} names {there}, not the {digest} this run pushed: "
                              "another push moved the tag meanwhile",
                              hint="find which run pushed last; push again, or choose another --tag")
            return digest
        except BaseException:
            try:
                image_id = self._engine.untag(tag)
                kept = image_id is not None and self._engine.tag_exists(image_id)
                self._notes.append(f"the push failed, so the tag {tag} was removed again; the image {image_id} "
                                   + ("stays: another name or container refers to it" if kept else "went with it"))
            except DsparkPatchError as exc:  # the push's own error says more; this one goes into the notes
                self._notes.append(exc.line())
            raise

    def refuse_existing_tag(self, tag: str, *, force: bool) -> None:
        """Fail early, before any work, when `tag` exists and may not be moved."""
        assert self._engine
        tag_lock.refuse_taken(self._engine, tag, force=force)

    def tag_source(self, tag: str, *, force: bool) -> CommittedImage:
        """Name the source image itself (it already carries the patch): no new layer."""
        assert self._engine
        tag_lock.name_image(self._engine, self._source.id, tag, force=force)
        return CommittedImage(ref=tag, id=self._source.id, layers=self._source.layers)
