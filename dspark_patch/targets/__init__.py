"""Where installed distributions and images live (base.py says what each kind must do)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .base import ImageStore


def open_store() -> ImageStore:
    """The image store this run works with: the Docker engine DOCKER_HOST names (one
    implementation today; EngineUnreachable, exit 3, when it does not answer). Each call connects
    anew: an apply/verify/probe run calls it once (pipeline/resolve.py's RunStore) and passes the
    store along."""
    from .docker.store import DockerStore

    return DockerStore()


__all__ = ["open_store"]
