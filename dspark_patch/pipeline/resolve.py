"""What a request's target names, decided once: a local tree, an image on the engine, an image
the engine pulls from a registry, or an image index.

`resolve` takes the first row of `CASES` whose condition holds. The facts the conditions ask
(is the name on the engine? a digest? which --pull?) are each asked at most once, and only when
a row needs them. The runs consume the `Source` it returns: `commands` opens its one target,
`index_run` runs each platform of an index through that same core. Every image source carries
the run's one store (`RunStore`): opened when a step first needs it, never a second time.

Without --platform, a registry error while reading the name is decided by its row, never
swallowed: an index's own fault (`BadManifest`) is refused before the engine pulls; a tag the
engine lacks and the registry says it does not have is one line (`TargetNotFound`); a registry
this process cannot reach or read is left to the engine's pull (its host may reach it: with
DOCKER_HOST it is not this one), and the report says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

from ..errors import BadInput, DsparkPatchError, EnvironmentProblem, TargetNotFound
from ..imageref import ImageRef
from ..registry.index import ImageIndex, Registry, check_before_pull
from ..routing import LOCAL, Route, container
from ..targets import open_store
from ..targets.base import ImageStore
from .requests import ImageSpec, LocalSpec, TargetSpec
from .runlog import RunLog


class RunStore:
    """The run's one image store, opened when a step first asks for it; every later ask gets the
    same store, or the same error (EngineUnreachable, exit 3) without a second try."""

    def __init__(self, opener: Callable[[], ImageStore] = open_store) -> None:
        self._opener = opener
        self._opened: ImageStore | DsparkPatchError | None = None

    def __call__(self) -> ImageStore:
        if self._opened is None:
            try:
                self._opened = self._opener()
            except DsparkPatchError as exc:
                self._opened = exc
        if isinstance(self._opened, DsparkPatchError):
            raise self._opened
        return self._opened


@dataclass(frozen=True, kw_only=True)
class LocalSource:
    """A folder holding the installed distribution (--root)."""

    spec: LocalSpec
    kind: Literal["local"] = "local"
    route: Route = LOCAL


@dataclass(frozen=True, kw_only=True)
class ImageSource:
    """One image: on the engine ("engine": used as it is, or pulled as --pull says) or in a
    registry ("registry": read here first where that can refuse it, then pulled by the engine)."""

    spec: ImageSpec
    store: RunStore
    kind: Literal["engine", "registry"] = "engine"
    note: str | None = None        # what the run's report says of how the source was decided
    route: Route                   # the report's route: a container of it, and which case of `CASES` led there


@dataclass(frozen=True, kw_only=True)
class IndexSource:
    """An image index in a registry, read and checked (`registry/manifest.py`): run per platform."""

    spec: ImageSpec
    store: RunStore
    index: ImageIndex
    kind: Literal["index"] = "index"
    route: Route                   # the whole run's: each platform's report names its own


Source = LocalSource | ImageSource | IndexSource

# What a row leads to: a source as it is ("local", "engine"), or a read of the registry first:
# "checked" (an index's own fault refused, the engine pulls the rest, as `check_before_pull`),
# "served" (the registry's answer decides: an index is run per platform), "platforms"
# (--platform: it must be an index). Every one of them is judged in a container of the image on
# the engine (routing.container), or in place for a folder: the report names the row's case.
Leads = Literal["local", "platforms", "engine", "checked", "served"]


class Facts:
    """What the table asks of a request, each fact asked once and only when a row needs it."""

    def __init__(self, spec: TargetSpec, store: RunStore) -> None:
        self.spec = spec
        self.store = store

    @property
    def local(self) -> bool:
        return isinstance(self.spec, LocalSpec)

    @property
    def image(self) -> ImageSpec:
        assert isinstance(self.spec, ImageSpec)  # every row after the first
        return self.spec

    @cached_property
    def host(self) -> str | None:
        """The registry the name names; None for an image id or a Docker Hub name."""
        return ImageRef.host_of(self.image.ref)

    @cached_property
    def digest(self) -> bool:
        return ImageRef.parse(self.image.ref).digest is not None

    @cached_property
    def on_engine(self) -> bool | None:
        """Whether the engine has the name; None when the engine does not answer (the image
        flow's "open target" step then says so)."""
        try:
            return self.store().tag_exists(self.image.ref)
        except DsparkPatchError:
            return None


@dataclass(frozen=True)
class Case:
    when: str
    holds: Callable[[Facts], bool]
    route: Leads


# First match wins. Only a row that is reached asks its facts: the engine is asked nothing for
# --pull never, and the registry is read only by the routes that say so.
CASES: tuple[Case, ...] = (
    Case("a local tree (--root)", lambda f: f.local, "local"),
    Case("--platform: an index in a registry", lambda f: f.image.platform is not None, "platforms"),
    Case("an image id, or a name with no registry host", lambda f: f.host is None, "engine"),
    Case("--pull never", lambda f: f.image.pull == "never", "engine"),
    Case("--pull missing, and the engine has the name", lambda f: f.image.pull == "missing" and f.on_engine is True,
         "engine"),
    Case("--pull missing, and the engine does not answer", lambda f: f.image.pull == "missing" and f.on_engine is None,
         "engine"),
    Case("a digest the engine will pull", lambda f: f.digest, "checked"),
    Case("--pull always of a name the engine has (or cannot say)", lambda f: f.on_engine is not False, "checked"),
    Case("a tag the engine lacks", lambda f: True, "served"),
)


def route(facts: Facts) -> Leads:
    return case_of(facts).route


def case_of(facts: Facts) -> Case:
    return next(case for case in CASES if case.holds(facts))


def resolve(spec: TargetSpec, run: RunLog, store: RunStore | None = None) -> Source:
    """The source `spec` names. Reads of the registry that may lead to an index run are the
    "read index" step of `run` (the index run goes on with it); a refusal is raised
    (DsparkPatchError), for the caller to report."""
    store = store or RunStore()
    facts = Facts(spec, store)
    case = case_of(facts)
    match case.route:
        case "local":
            assert isinstance(spec, LocalSpec)
            return LocalSource(spec=spec)
        case "platforms":
            return IndexSource(spec=facts.image, store=store, index=_platforms(facts, run),
                               route=container(f"{case.when}: each platform's image pulled by its digest"))
        case "engine":
            return ImageSource(spec=facts.image, store=store, kind="engine", route=container(case.when))
        case "checked":
            # The engine pulls by this name and would silently take one entry of an index
            # that lists a platform twice: a malformed index is refused first. Anything else
            # the registry says is the engine's pull to report, in its own words.
            check_before_pull(facts.image.ref)
            return ImageSource(spec=facts.image, store=store, kind="registry",
                               route=container(f"{case.when}, pulled from its registry"))
        case "served":
            return _served(facts, store, run, container(f"{case.when}: pulled from its registry"))


def _platforms(facts: Facts, run: RunLog) -> ImageIndex:
    """--platform selects platforms of an index: anything else is refused."""
    spec = facts.image
    if facts.host is None:
        raise BadInput(
            f"--platform selects platforms of an image index in a registry; {spec.ref} names no registry host",
            hint="name the index with its registry, e.g. registry.example:5000/vllm/vllm-openai:TAG",
        )
    with run.step("read index"):
        index = Registry(facts.host).fetch_index(spec.ref)
    if index is None:
        raise BadInput(
            f"{spec.ref} is a single-platform image, not an index; --platform selects platforms of an index",
            hint="drop --platform",
        )
    return index


def _served(facts: Facts, store: RunStore, run: RunLog, route: Route) -> Source:
    """A tag the engine lacks, as its registry serves it."""
    spec, host = facts.image, facts.host
    assert host is not None  # "engine" took the names without one
    try:
        with run.step("read index"):
            index = Registry(host).fetch_index(spec.ref)
    except TargetNotFound:  # the registry answered: it has no such name
        raise TargetNotFound(f"image {spec.ref} is neither on the engine nor in its registry {host}",
                             hint="check the name and tag (`docker images`, the registry's catalog)") from None
    except EnvironmentProblem as exc:  # not reachable or readable from here; the engine's host may reach it
        note = (f"{host} could not be read from here ({exc.message}), so {spec.ref} was not checked for an "
                "image index: the engine pulls it as one image")
        return ImageSource(spec=spec, store=store, kind="registry", note=note, route=route)
    if index is None:
        return ImageSource(spec=spec, store=store, kind="registry", route=route)
    return IndexSource(spec=spec, store=store, index=index,
                       route=container(f"{facts.image.ref} is an image index in its registry: each platform run "
                                       "pulled by its digest"))


__all__ = ["CASES", "Case", "case_of", "Facts", "ImageSource", "IndexSource", "LocalSource", "RunStore", "Source", "resolve", "route"]
