"""`dspark-patch gc`: what killed runs left on the engine, removed."""

from __future__ import annotations

from .client import DockerEngine
from .tag_lock import remove_stale_locks


def gc_containers(engine: DockerEngine | None = None, *, include_kept: bool = True) -> list[str]:
    """Remove every container of ours whose run is gone, including kept ones (the user asked to
    clean up), and the tag locks killed runs left. Returns the removed containers' names."""
    engine = engine or DockerEngine()
    return engine.gc_containers(include_kept=include_kept) + remove_stale_locks(engine)
