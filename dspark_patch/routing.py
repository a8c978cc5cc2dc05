"""Which route judged an image, and why: the one home of the route names, their reasons, and
the choice of `verify`'s and `status`'s route.

A route is where the files a verdict rests on were read: `container` (a container of an image
on the engine), `layers` (the engine's save of the image, through the strict layer reader),
`registry` (the image's layers straight from its registry; no engine), `local` (a folder named
with --root) or `in-image` (a job's run inside the image, its layer then proven and published
by `publish`). Every report carries the `Route` its verdict came through, with the reason a
user reads ("asked with --via registry", "the engine has no image named X: read from its
registry"); renderers only show it.

The choices below are pure: the facts they need (does an engine answer? is every layer in the
scan cache?) are handed in, as callables where a fact costs something to learn, and asked only
when a row of the table needs them. `pipeline/resolve.py` decides how apply, verify and probe
reach an image on the engine (its case table) and names the route through `container` here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from .errors import BadInput, DsparkPatchError
from .imageref import ImageRef

RouteName = Literal["container", "layers", "registry", "local", "in-image"]
VerifyVia = Literal["auto", "engine", "registry"]
StatusVia = Literal["auto", "layers", "container", "registry"]


@dataclass(frozen=True, kw_only=True)
class Route:
    """The route a verdict came through, and why that one."""

    name: RouteName
    reason: str


LOCAL = Route(name="local", reason="a folder named with --root: its files read in place")
IN_IMAGE = Route(name="in-image", reason="publish: the in-image job's run (apply --root inside the image); its layer "
                                         "proven here and put onto the image in its registry, with no engine")
ATTESTATION = Route(name="registry", reason="asked with --attestation: the signed attestation attached to the image "
                                            "in its registry (manifests and the envelope only; no layer, no engine)")
NO_ENGINE = "no engine answered at $DOCKER_HOST"


def container(why: str) -> Route:
    """apply, verify or probe in a container of an image on the engine; `why` is resolve's case."""
    return Route(name="container", reason=f"a container of the image on the engine ({why})")


def platform_container(platform: str, index: str) -> Route:
    return Route(name="container", reason=f"a container of {platform}'s image, pulled by the digest the index {index} "
                                          "names (--platform)")


# verify --via: which route reads the image. The engine's side (a container, how the image gets
# there) is resolve's table; this one says only whether the registry reads it instead.

def verify_route(via: str, *, image: str | None, root: object | None, python: str | None, platform: str | None,
                 pull: str, strip: int | None,
                 no_engine: Callable[[], DsparkPatchError | None]) -> tuple[Route | None, DsparkPatchError | None]:
    """The registry route when this verify reads its image from the registry (--via registry, or
    auto with an image that names its registry when no engine answers), with the engine's error
    when auto chose it; (None, None) when the engine's verify runs (resolve.py decides how).
    `no_engine` is asked only for auto with an image that names its registry."""
    if via not in ("auto", "engine", "registry"):
        raise BadInput(f"--via {via!r}: choose auto, engine or registry")
    if via == "registry":
        if image is None or root is not None:
            raise BadInput("--via registry reads an image from its registry: give --image HOST[:PORT]/REPO:TAG, not --root")
        for given, option in ((platform, "--platform"), (strip, "--strip")):
            if given is not None:
                raise BadInput(f"{option} is for the engine's verify; --via registry runs nothing of the image",
                               hint=f"drop {option}, or use --via engine")
        if pull != "missing":
            raise BadInput("--pull asks the engine to pull; --via registry reads the registry without one",
                           hint="drop --pull")
        return asked_registry(), None
    if via == "engine" or image is None or root is not None or python is not None or platform is not None:
        return None, None
    host = ImageRef.host_of(image)
    if host is None:
        return None, None
    error = no_engine()
    if error is None:
        return None, None
    return Route(name="registry", reason=f"{NO_ENGINE}, and {image} names its registry {host}: its layers read "
                                         "from there, nothing run (--via auto)"), error


def asked_registry() -> Route:
    return Route(name="registry", reason="asked with --via registry: the image's layers read from its registry, "
                                         "with no engine and nothing run")


# status --via: the engine's route for a run's images, and when the registry reads them instead.

def status_engine(via: StatusVia, *, platform: str | None, images: int, all_cached: Callable[[], bool]) -> Route:
    """How the engine's images of one status run are read: every row of the run the same way.
    `all_cached` (every layer of the one image in the scan cache) is asked only for auto with
    one image and no --platform."""
    if via == "layers":
        return Route(name="layers", reason="asked with --via layers: one save of the images' layers, read with the "
                                           "strict layer reader")
    if via == "container":
        return Route(name="container", reason="asked with --via container: the site folder through a (never "
                                              "started) container of the image")
    if platform is not None:
        return Route(name="container", reason="auto with --platform: the engine's create takes the platform, so a "
                                              "(never started) container of the image")
    if images > 1:
        return Route(name="layers", reason="auto, several images: one save of their layers, a layer shared by many "
                                           "read once")
    if images == 0:
        return Route(name="container", reason="auto: the engine was asked for the image, and has none of the names "
                                              "given")
    if images == 1 and all_cached():
        return Route(name="layers", reason="auto: every layer of the image is in the scan cache, so nothing is read "
                                           "but its inspect")
    return Route(name="container", reason="auto, one image: its site folder through a (never started) container "
                                          "is the cheaper read")


def status_registry(via: StatusVia) -> Route | None:
    """--via registry: every image from its registry, the engine never asked."""
    return asked_registry() if via == "registry" else None


def status_without_engine(via: StatusVia, refs: Sequence[str]) -> Route | None:
    """No engine answers: auto reads the registry when every image names its registry; else None
    (the run is the engine's error, exit 3)."""
    if via != "auto" or not all(ImageRef.host_of(ref) for ref in refs):
        return None
    return Route(name="registry", reason=f"{NO_ENGINE}, and every image names its registry: read from there "
                                         "(--via auto)")


def status_absent(via: StatusVia, pull: str, ref: str) -> Route | None:
    """An image the engine lacks: auto, asked not to pull, reads it from its registry (when the
    registry has it); else None (its row is the engine's "not found")."""
    if via != "auto" or pull != "never":
        return None
    return Route(name="registry", reason=f"the engine has no image named {ref}: read from its registry (--via auto)")


__all__ = ["ATTESTATION", "IN_IMAGE", "LOCAL", "Route", "RouteName", "StatusVia", "VerifyVia", "asked_registry", "container",
           "platform_container", "status_absent", "status_engine", "status_registry", "status_without_engine",
           "verify_route"]
