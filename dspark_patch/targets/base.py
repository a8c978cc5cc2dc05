"""What a target is: a place where an installed distribution lives and can be patched; and
what an image store is: where images are pulled, inspected, tagged, pushed and opened.

Two kinds of target exist: a local site-packages folder (`targets.local.LocalTree`) and a
container made from an image (`targets.docker.ImageTarget`). The pipeline talks to `Target`, so
the same plan, hash checks and report serve both; the steps only an image has (layer, labels,
commit, tag, push) ask for `ImageCapable`, checked once per run.

Images themselves are reached through `ImageStore` (one implementation today: the Docker
engine, `targets.docker.DockerEngine`), handed out by `targets.open_store()`: the pipeline and
`status` never name the implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, NamedTuple, Protocol, runtime_checkable

if TYPE_CHECKING:
    import threading

    from ..errors import DsparkPatchError
    from ..patching.plan import PatchPlan
    from .caches.scans import ScanCache
    from .layers import LayersRead, LayerView, TakenLayer
    from .probe_record import ProbeRecord
    from .recovery import Recovery
    from .views.site_files import SiteFiles

TargetKind = Literal["local", "image"]
# When an image is pulled, as `docker run --pull` says: the one declaration of it.
PullPolicy = Literal["never", "missing", "always"]
# The go-ahead files of `PreStarting.put_handshake` live at the target's root under this prefix.
HANDSHAKE_PREFIX = ".dspark-patch-go-"


@dataclass(frozen=True, kw_only=True)
class TargetInfo:
    kind: TargetKind
    ref: str          # the directory for a local tree; the image reference as given for an image
    id: str | None    # the image id (sha256:...) for an image; None for a local tree
    layers: tuple[str, ...] = ()  # an image's diff_ids, bottom first; () for a local tree


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
class PullProgress:
    """One event of an image pull: a layer's step (`layer` set) or a line about the whole image."""

    ref: str
    layer: str | None         # short layer id; None for image-wide lines ("Digest: …", the last one)
    status: str               # the engine's words: "Pulling fs layer", "Downloading", "Pull complete", …
    current: int | None = None
    total: int | None = None
    done: bool = False        # the last event of this pull


PullCallback = Callable[[PullProgress], None]


class ImageInfo(NamedTuple):
    """An image as its store inspects it."""

    id: str                       # sha256:... (the config digest)
    config: dict[str, Any]        # the image's Config, as the store reports it
    layers: int                   # number of filesystem layers (RootFS.Layers)
    repo_tags: tuple[str, ...]
    diff_ids: tuple[str, ...] = ()  # RootFS.Layers: each layer's uncompressed digest
    architecture: str = ""
    os: str = ""
    variant: str = ""
    repo_digests: tuple[str, ...] = ()  # "name@sha256:..." of each registry manifest it was pulled as

    @property
    def platform(self) -> str:
        """`os/architecture[/variant]`, as indexes and `--platform` spell it (os defaults to linux)."""
        return "/".join(p for p in (self.os or "linux", self.architecture, self.variant) if p)


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

    def take_layer(self, paths: Sequence[str], deleted: Sequence[str] = ()) -> TakenLayer:
        """Take the new layer from the target as it is now: exactly the files `paths` (relative
        to `location`), a whiteout for each of `deleted`, and the folders above them, with their
        owner, mode and bytes. `commit`
        builds the image from it; what happens in the target afterwards (the probe) cannot
        reach it."""
        ...

    def source_labels(self) -> Mapping[str, str]:
        """The source image's labels."""
        ...

    def source_config(self) -> Mapping[str, Any]:
        """The source image's config (Env, Entrypoint, Cmd, User, Labels, ...)."""
        ...

    def check_layers(self, distribution: str, retain: Iterable[str], cache: ScanCache, *, save: bool = True,
                     stop: threading.Event | None = None) -> LayersRead:
        """Read the source image's layers with the strict layer reader and raise what it refuses;
        layers `cache` holds are not read again, the others only if `save` (a save of the whole
        image). How they were read; setting `stop` ends a read under way."""
        ...

    def cache_layer_scan(self, distribution: str, retain: Iterable[str], cache: ScanCache) -> None:
        """Keep the scan of the layer `commit` added in `cache`, by its diff_id, as
        `check_layers` keeps the source's: its bytes are the tool's own, so a later read of the
        result need not save the image for it."""
        ...

    def answer_key(self, source: str, args: Sequence[Any]) -> str | None:
        """The key under which the image's answer to the read-only script `source` with `args`
        (run by the distribution's python) is kept by image id (targets/caches/answers.py); None once
        anything was written into the target."""
        ...

    def unimported(self, distribution: str) -> tuple[str, ...]:
        """Site folders of the image that hold `distribution` but that no interpreter of the
        image imports it from (a decoy, a stale second install); after `locate`."""
        ...

    def runs_first(self, distribution: str, location: str, python: str | None) -> tuple[str, ...]:
        """What the image, started as its config says, runs before or instead of the
        distribution at `location`, one line each (targets/runtime.py); after `locate`."""
        ...

    def as_started(self, distribution: str, location: str) -> tuple[str, ...]:
        """The same question asked of the image's own python, started as the image starts it:
        what it imported at start and where it resolves the distribution. Findings only, one
        line each (targets/runtime.py `judge_started`); after `locate`."""
        ...

    def refuse_existing_tag(self, tag: str, *, force: bool) -> None:
        """Raise TagExists when `tag` exists and `force` is not given."""
        ...

    def commit(self, *, labels: Mapping[str, str]) -> CommittedImage:
        """One new layer (the one `take_layer` took) on top of the source, its config kept and
        `labels` added; untagged (`name` gives it its tag, last)."""
        ...

    def name(self, tag: str, *, force: bool) -> CommittedImage:
        """Tag the committed result as `tag`, only if the tag is still free (or `force`), under
        the engine's lock on the tag: another run's tag is never moved silently."""
        ...

    def discard(self) -> str | None:
        """Remove the committed result again (the run failed after the commit); its id, if one
        was removed. A tagged result loses this run's tag first."""
        ...

    def tag_source(self, tag: str, *, force: bool) -> CommittedImage:
        """Name the source image itself (it already carries the patch): no new layer."""
        ...

    def push(self, tag: str) -> str:
        """Push `tag` to its registry; the pushed manifest digest."""
        ...


@runtime_checkable
class Journaled(Protocol):
    """A target whose apply a later run finishes or undoes when the tool was killed half-way (a
    local tree: targets/journal.py, recovery.py, probe_record.py). The pipeline checks for it once."""

    def pending(self) -> str | None:
        """Where the journal of an unfinished apply is, when there is one (not read)."""
        ...

    def recover(self, diff_sha256: str, paths: frozenset[str]) -> Recovery | None:
        """Finish what an interrupted apply's journal says, before this run plans: keep its
        post-images when they are all in place for this very diff (the journal stays: compile and
        probe them), else roll back. None when there is no journal."""
        ...

    def write_journaled(self, plan: PatchPlan, bytecode: Sequence[str]) -> None:
        """`write`, with the journal written first: the pre-images of the plan and of `bytecode`
        (paths relative to `location`, which the compile step will replace)."""
        ...

    def roll_back(self) -> Recovery:
        """Put back every pre-image the journal holds, and remove it (a failed compile or probe)."""
        ...

    def probed(self, record: ProbeRecord) -> bool:
        """Whether a passing probe of exactly `record` (post-images, probe, interpreter) is kept."""
        ...

    def settle(self, record: ProbeRecord | None) -> None:
        """The run is whole (its report kept): keep `record` (a passing probe), remove the journal."""
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


@runtime_checkable
class HashesFiles(Protocol):
    """A target whose files the host can hash from the bytes its engine streams (an image):
    where the target's own python runs emulated, the integrity walk leaves the hashing to the
    host (targets/docker/tree_hashes.py); natively the target's python is the faster of the two."""

    @property
    def emulated(self) -> bool:
        """Whether the target's programs run under emulation (another architecture than the engine's)."""
        ...

    def file_hashes(self, location: str, folders: Sequence[str]) -> Mapping[str, tuple[str, int]] | None:
        """{path relative to `location`: (sha256, size)} of the regular files under `folders`;
        None when it cannot tell (the walk then hashes them itself)."""
        ...


class SiteReader(Protocol):
    """An image's site folder read without running anything (`ImageStore.open_reader`)."""

    image_platform: str | None    # set once opened: os/architecture[/variant]

    def read_site(self, distribution: str, *, retain: Iterable[str] = ()) -> SiteFiles: ...


class ImageStore(Protocol):
    """Where images live: the one way the pipeline and `status` reach them (`targets.open_store`)."""

    host: str                     # where the store is, for messages (the engine's DOCKER_HOST)

    def image_info(self, ref: str) -> ImageInfo:
        """Inspect `ref` (name, name@digest or id); TargetNotFound when the store lacks it."""
        ...

    def tag_exists(self, name: str) -> bool: ...

    def ensure_image(self, ref: str, *, pull: PullPolicy, platform: str | None = None,
                     on_progress: PullCallback | None = None) -> tuple[ImageInfo, bool]:
        """`ref` in the store, pulled first as `pull` says; its info and whether it was pulled."""
        ...

    def tag(self, image_id: str, name: str, *, force: bool) -> None:
        """Name `image_id`; a tag set meanwhile by another run is a TagRace unless `force`."""
        ...

    def refuse_existing_tag(self, tag: str, *, force: bool) -> None:
        """Raise TagExists when `tag` names an image already and `force` is not given."""
        ...

    def push(self, tag: str) -> str:
        """Push `tag` to its registry; the pushed manifest digest (sha256:...)."""
        ...

    def remove_image(self, ref: str, *, force: bool = False) -> None: ...

    def image_under_top(self, image_id: str, *, label_prefix: str) -> tuple[str, bool]:
        """Load the image under `image_id`'s last layer (that layer one of ours: its labels under
        `label_prefix` go too); returns its id and whether the store had it already (then it is
        not the caller's to remove; otherwise the caller removes it when done)."""
        ...

    def platform(self) -> tuple[str, str, str]:
        """(os, architecture, variant) of the store's own host, as image indexes spell them."""
        ...

    def check_emulation(self, image_id: str, platform: str) -> None:
        """Raise EnvironmentProblem when the store's host cannot run `platform`'s programs."""
        ...

    def open_image(self, ref: str, *, python: str | None = None, pull: PullPolicy = "never",
                   on_pull: PullCallback | None = None) -> AbstractContextManager[ImageCapable]:
        """A patch target made from `ref` (pulled as `pull` says), for a `with` block."""
        ...

    def open_reader(self, ref: str, *, platform: str | None = None,
                    image_id: str | None = None) -> AbstractContextManager[SiteReader]:
        """A reader of `ref`'s site folder (an id pins exactly the image a caller grouped tags by)."""
        ...

    def removed_on_term(self) -> AbstractContextManager[None]:
        """For a block whose readers run on other threads: a SIGTERM removes what this process
        made in the store and ends the run (exit 143)."""
        ...

    def save_views(self, image_ids: Sequence[str], distribution: str,
                   retain: Iterable[str] = (), cache: ScanCache | None = None) -> dict[str, LayerView | DsparkPatchError]:
        """Every image's merged layer view from one save of all of them (shared layers read once;
        each layer's scan kept in `cache` by its digest); an image whose layers cannot be read
        maps to its error."""
        ...
