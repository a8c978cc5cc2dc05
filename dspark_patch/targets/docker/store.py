"""The Docker engine as an `ImageStore` (targets/base.py): what the pipeline and `status` may
ask of images, each answered by the module that owns it here (client, transfer, emulation,
result_image, reader, save_views, target). `targets.open_store()` hands it out; nothing outside
this package names it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager

from ...errors import DsparkPatchError
from ..base import ImageInfo, PullCallback, PullPolicy
from ..caches.scans import ScanCache
from ..layers import LayerView
from . import reader
from .client import DockerEngine
from .emulation import check_emulation, engine_platform
from .save_views import save_views
from .tag_lock import name_image, refuse_taken
from .target import ImageTarget


class DockerStore:
    """One engine's images, through the `ImageStore` interface."""

    def __init__(self, engine: DockerEngine | None = None) -> None:
        self.engine = engine or DockerEngine()  # unreachable: EngineUnreachable (exit 3)
        self.host = self.engine.host

    def image_info(self, ref: str) -> ImageInfo:
        return self.engine.image_info(ref)

    def tag_exists(self, name: str) -> bool:
        return self.engine.tag_exists(name)

    def ensure_image(self, ref: str, *, pull: PullPolicy, platform: str | None = None,
                     on_progress: PullCallback | None = None) -> tuple[ImageInfo, bool]:
        return self.engine.ensure_image(ref, pull=pull, platform=platform, on_progress=on_progress)

    def tag(self, image_id: str, name: str, *, force: bool) -> None:
        """Name `image_id` under the engine's lock on `name` (tag_lock.py): a tag another run set
        meanwhile is a TagRace unless `force`."""
        name_image(self.engine, image_id, name, force=force)

    def refuse_existing_tag(self, tag: str, *, force: bool) -> None:
        refuse_taken(self.engine, tag, force=force)

    def push(self, tag: str) -> str:
        return self.engine.push(tag)

    def remove_image(self, ref: str, *, force: bool = False) -> None:
        self.engine.remove_image(ref, force=force)

    def image_under_top(self, image_id: str, *, label_prefix: str) -> tuple[str, bool]:
        """Load the image under `image_id`'s last layer (append.load_under_top); its id."""
        from .append import load_under_top

        return load_under_top(self.engine, self.engine.image_info(image_id), label_prefix=label_prefix)

    def platform(self) -> tuple[str, str, str]:
        return engine_platform(self.engine)

    def check_emulation(self, image_id: str, platform: str) -> None:
        check_emulation(self.engine, image_id, platform)

    def open_image(self, ref: str, *, python: str | None = None, pull: PullPolicy = "never",
                   on_pull: PullCallback | None = None) -> ImageTarget:
        return ImageTarget(ref, engine=self.engine, python=python, pull=pull, on_pull=on_pull)

    def open_reader(self, ref: str, *, platform: str | None = None, image_id: str | None = None) -> reader.ImageReader:
        return reader.ImageReader(ref, engine=self.engine, platform=platform, image_id=image_id)

    def removed_on_term(self) -> AbstractContextManager[None]:
        return self.engine.removed_on_term()

    def save_views(self, image_ids: Sequence[str], distribution: str,
                   retain: Iterable[str] = (), cache: ScanCache | None = None) -> dict[str, LayerView | DsparkPatchError]:
        return save_views(self.engine, image_ids, distribution, retain, cache)


__all__ = ["DockerStore"]
