"""What an image target's helpers ask of it (`WorkImage`): its image, engine and work container,
and the path stats and small reads through that container. target.py's ImageTarget is one; the
helpers take it as a parameter and never import it.
"""

from __future__ import annotations

from typing import Any, Protocol

from .client import DockerEngine, ImageInfo
from .container import WorkContainer


class WorkImage(Protocol):
    """What the helpers of an image target (locate.py, started.py) ask of it: target.py's
    ImageTarget, which hands itself to them."""

    ref: str

    @property
    def source(self) -> ImageInfo: ...

    @property
    def engine(self) -> DockerEngine: ...

    @property
    def container(self) -> WorkContainer: ...

    @property
    def written(self) -> bool:
        """Anything copied into the work container: no answer is kept after."""
        ...

    @property
    def emulated(self) -> bool:
        """Whether the image is of another architecture than the engine's host (qemu runs it)."""
        ...

    def stat(self, path: str) -> dict[str, Any] | None: ...

    def read_small(self, path: str) -> bytes | None: ...
