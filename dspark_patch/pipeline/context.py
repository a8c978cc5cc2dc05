"""What one `apply` run works over, fixed once before it plans: the patch set and its check
policy, the installed distribution, the variant and its diff, the image or local flow, the
early probe start and the layer check; the plan once it is made (a new context, never a
changed one). apply's steps (apply_steps.py) each take this one context."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..patching.diff import Diff
from ..patching.plan import PatchPlan
from ..patchset import PatchSet, Variant
from ..targets.base import Distribution, ImageCapable, Journaled, Target
from ..targets.recovery import Recovery
from .image_steps import LayerCheck, LayerWriter
from .policy import CheckPolicy
from .requests import ApplyRequest, ImageSpec
from .runlog import ResultCallback, RunLog
from .series_steps import Folded
from .shared_steps import CachingReader, EarlyStart

# How an apply run ends; decided in one place (commands.py: _outcome).
Outcome = Literal["applied", "already-applied", "dry-run"]

# The steps a run that writes nothing (already applied, a dry run) lists as skipped, in order.
UNWRITTEN = ("write", "compile", "probe")


@dataclass(frozen=True, kw_only=True)
class ImageFlow:
    spec: ImageSpec          # what the caller asked of the image (tag, force, push)
    target: ImageCapable     # the container made from it


@dataclass(frozen=True, kw_only=True)
class LocalFlow:
    target: Journaled
    recovery: Recovery | None     # what this run did with an interrupted apply's journal

    @property
    def continued(self) -> bool:
        """Whether this run finishes an interrupted apply whose post-images were all in place."""
        return self.recovery is not None and self.recovery.outcome == "continued"


@dataclass(frozen=True, kw_only=True)
class ApplyContext:
    request: ApplyRequest
    target: Target
    run: RunLog
    on_result: ResultCallback | None
    patchset: PatchSet
    policy: CheckPolicy
    dist: Distribution
    variant: Variant
    diff: Diff
    reader: CachingReader                 # the target's files, each read once
    early: EarlyStart                     # the probe started early (or not wanted)
    image: ImageFlow | None               # an image: its spec and container
    local: LocalFlow | None               # a local tree with a journal
    layers: LayerCheck | None             # an image's layers read beside the steps
    plan: PatchPlan | None = None         # once planned
    pyc_before: dict[str, bytes | None] | None = None  # the bytecode before the write, for its restore
    folded: Folded | None = None          # a series of several patch sets: its members (patchset is the fold)
    layer_out: LayerWriter | None = None  # a local tree whose layer --layer-out writes

    @property
    def planned(self) -> PatchPlan:
        assert self.plan is not None, "a step that needs the plan ran before it"
        return self.plan

    @property
    def probe_skipped(self) -> str | None:
        """Why this run's probe does not run (--no-probe; the patch set has none), or None: it runs."""
        if not self.request.probe:
            return "--no-probe"
        return "this patch set has no probe" if self.patchset.probe is None else None
