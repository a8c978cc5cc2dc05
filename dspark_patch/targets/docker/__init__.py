"""A container image as a patch target: the only package that talks to the Docker engine.

One idea a module:
  client.py     DockerEngine: connect, images (inspect, pull, tag, push, remove), path stats,
                our containers (list, gc), and `started` (an image run with its own entrypoint)
  transfer.py   pull and push with the docker config's login; progress events; registry errors
  naming.py     our containers' names and who owns one (the only place that decides either)
  container.py  WorkContainer: one keep-alive container; call, copy_out, copy_into (never committed)
  append.py     the source plus one layer tar, config kept, loaded as a `docker load` archive
  result_image.py  the patched image: source + layer (append.py), checked field by field;
                ResultImage: it named last, pushed, or taken back; a source named as it is
  tag_lock.py   the tag, set last under the engine's lock on it (a container name is atomic)
  gc.py         `dspark-patch gc`: killed runs' containers and tag locks
  save_views.py  the images' layers from one `docker save` stream, scanned as they arrive
  store.py      DockerStore: the engine as the `ImageStore` of targets/base.py (targets.open_store)
  signals.py    SIGTERM -> SystemExit while a container is alive, so it is removed
  target.py     ImageTarget: the Target protocol and ImageCapable on top of those
  work_image.py WorkImage: what ImageTarget's helpers below ask of it (they never import it)
  locate.py     which python of the image owns a distribution; copies no interpreter imports
  started.py    the image's own python, started as the image starts it: what it imports first
  layer_check.py  the source's layers and the new layer through the strict layer reader
"""

from __future__ import annotations

from ..base import ImageInfo
from .client import ContainerState, DockerEngine, StartedContainer
from .gc import gc_containers
from .naming import KEEP_ENV, NAME_PREFIX
from .result_image import CONFIG_FIELDS
from .target import ImageTarget

__all__ = [
    "CONFIG_FIELDS",
    "KEEP_ENV",
    "NAME_PREFIX",
    "ContainerState",
    "DockerEngine",
    "ImageInfo",
    "ImageTarget",
    "StartedContainer",
    "gc_containers",
]
