"""What a target is: a place where an installed distribution lives and can be patched.

Two kinds exist: a local site-packages folder (`targets.local.LocalTree`) and a container made
from an image (`targets.docker.ImageTarget`). The pipeline talks to `Target`, so the same plan,
hash checks and report serve both; the steps only an image has (layer, labels,
commit, tag, push) ask for `ImageCapable`, checked once per run.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    from ..patching.plan import PatchPlan

TargetKind = Literal["local", "image"]
# The go-ahead files of `PreStarting.put_handshake` live at the target's root under this prefix.
HANDSHAKE_PREFIX = ".dspark-patch-go-"


@dataclass(frozen=True, kw_only=True)
class TargetInfo:
    kind: TargetKind
    ref: str          # the directory for a local tree; the image reference as given for an image
    id: str | None    # the image id (sha256:...) for an image; None for a local tree


@dataclass(frozen=True, kw_only=True)
class RecordEntry:
    path: str                 # as written in RECORD, relative to `location`
    sha256: str | None        # hex digest, None when RECORD lists no hash (RECORD itself, .pyc)
    size: int | None


@dataclass(frozen=True, kw_only=True)
class Distribution:
    name: str
    version: str
    location: str             # absolute path (inside the target) of the folder holding the package
    python: str               # the interpreter (inside the target) that runs the package
    python_version: str       # e.g. "3.11.2"
    cache_tag: str            # sys.implementation.cache_tag, e.g. "cpython-311" (names __pycache__ files)
    record_file: str | None   # the RECORD's path relative to `location`, e.g. "vllm-0.33.0.dist-info/RECORD"
    record: tuple[RecordEntry, ...]


@dataclass(frozen=True, kw_only=True)
class RunResult:
    returncode: int
    stdout: bytes
    stderr: bytes
    timed_out: bool = False


@dataclass(frozen=True, kw_only=True)
class CommittedImage:
    ref: str                  # the tag given, or the id when committed without a tag
    id: str
    layers: int


@dataclass(frozen=True, kw_only=True)
class LayerEntry:
    path: str                 # absolute, inside the image
    folder: bool
    sha256: str | None        # a file's content digest; None for a folder or a deletion
    deleted: bool = False     # a whiteout: the layer removes this path


@dataclass(frozen=True, kw_only=True)
class PullProgress:
    """One event of an image pull: a layer's step (`layer` set) or a line about the whole image."""

    ref: str
    layer: str | None         # short layer id; None for image-wide lines ("Digest: …", the last one)
    status: str               # the engine's words: "Pulling fs layer", "Downloading", "Pull complete", …
    current: int | None = None
    total: int | None = None
    done: bool = False        # the last event of this pull


PullCallback = Callable[[PullProgress], None]


class Target(Protocol):
    """Everything the pipeline needs from a place that holds an installed distribution.

    Paths given to `read`/`write` are relative to the distribution's `location`.
    """

    @property
    def info(self) -> TargetInfo: ...

    @property
    def notes(self) -> tuple[str, ...]:
        """What the target did on its own that the report should say (complete once closed:
        a kept container, leftovers of a killed run it removed)."""
        ...

    def locate(self, distribution: str) -> Distribution:
        """Find the installed distribution without importing it.

        Raises TargetNotFound (no interpreter, no such distribution)."""
        ...

    def read(self, path: str) -> bytes | None:
        """Current bytes of a file under `location`, or None if it does not exist."""
        ...

    def write(self, plan: PatchPlan) -> None:
        """Write every post-image of the plan, all or nothing (owner, group and mode kept)."""
        ...

    def restore(self, plan: PatchPlan) -> None:
        """Put every pre-image of the plan back (after a failed compile or probe)."""
        ...

    def run_python(
        self,
        source: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 600.0,
    ) -> RunResult:
        """Run `python -B -c SOURCE ARGS...` with the target's own interpreter.

        The source travels as an argument so nothing is written into the target; the
        environment is given per run and never persists."""
        ...


@runtime_checkable
class ImageCapable(Target, Protocol):
    """A target made from a container image: what only such a target can do.

    The pipeline checks for it once (`isinstance(target, ImageCapable)`) and hands the result
    to the image-only steps, which are typed with it."""

    def take_layer(self, paths: Sequence[str], deleted: Sequence[str] = ()) -> tuple[LayerEntry, ...]:
        """Take the new layer from the target as it is now: exactly the files `paths` (relative
        to `location`), a whiteout for each of `deleted`, and the folders above them, with their
        owner, mode and bytes. `commit`
        builds the image from it; what happens in the target afterwards (the probe) cannot
        reach it."""
        ...

    def source_labels(self) -> Mapping[str, str]:
        """The source image's labels."""
        ...

    def refuse_existing_tag(self, tag: str, *, force: bool) -> None:
        """Raise TagExists when `tag` exists and `force` is not given."""
        ...

    def commit(self, *, labels: Mapping[str, str], tag: str | None, force: bool = False) -> CommittedImage:
        """One new layer (the one `take_layer` took) on top of the source, its config kept and
        `labels` added; tagged only once verified."""
        ...

    def tag_source(self, tag: str, *, force: bool) -> CommittedImage:
        """Name the source image itself (it already carries the patch): no new layer."""
        ...

    def push(self, tag: str) -> str:
        """Push `tag` to its registry; the pushed manifest digest."""
        ...


class Running(Protocol):
    """A python run started by `PreStarting.start_python`, still going."""

    def wait(self, timeout: float | None = None) -> RunResult:
        """Its result, waiting at most `timeout` seconds from now (default: its own limit)."""
        ...


@runtime_checkable
class PreStarting(Protocol):
    """A target that can start a python early and hand it a go-ahead later (probe/prestart.py):
    the interpreter and its imports overlap the tool's other steps."""

    def start_python(
        self, source: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None, timeout: float = 600.0,
    ) -> Running:
        """`run_python`, returning at once."""
        ...

    def put_handshake(self, name: str, data: bytes) -> None:
        """Write the file `/NAME` outside every site folder (never part of a layer)."""
        ...
