"""What a target is: a place where an installed distribution lives and can be patched.

Two kinds exist: a local site-packages folder (`targets.local.LocalTree`) and a container made
from an image (`targets.image.ImageTarget`). The pipeline only ever talks to this protocol, so
the same plan, hash checks and report serve both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, Protocol

if TYPE_CHECKING:
    from ..engine.plan import PatchPlan

TargetKind = Literal["local", "image"]


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


class Target(Protocol):
    """Everything the pipeline needs from a place that holds an installed distribution.

    Paths given to `read`/`write` are relative to the distribution's `location`.
    """

    @property
    def info(self) -> TargetInfo: ...

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
