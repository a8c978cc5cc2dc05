"""The result of `dspark-patch status`: one row per image, frozen, built once.

Renderers (JSON against `status.schema.json`, Markdown, JUnit) live in `report.status_render`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..routing import Route
from .evidence import redact, redact_all

STATUS_SCHEMA = "dspark-patch/status/v1"

# applied: every file is its post-image; absent: every file is its pre-image; partial: some of
# each; drifted: a file is neither; not-applicable: the patch set has no variant for the release;
# upstream: it has none, and the release already has its newest variant's change.
# superseded: it has none, and a reviewed `[[superseded]]` record names the release, its files as proven.
PatchSetState = Literal["applied", "absent", "partial", "drifted", "not-applicable", "upstream", "superseded"]
# With `status --key`, per applied patch set: yes, a valid signed attestation is attached to the
# image's manifest in its registry; no, none is; invalid, one is but it does not hold (a finding).
AttestedState = Literal["yes", "no", "invalid"]


@dataclass(frozen=True, kw_only=True)
class ImageStatus:
    ref: str
    id: str | None = None                 # image id (sha256:...), None for a local folder or a missing image
    platform: str | None = None           # "linux/amd64"
    location: str | None = None           # the site folder vLLM was found in
    release: str | None = None
    python: str | None = None             # "3.11"
    patch_sets: tuple[tuple[str, PatchSetState], ...] = ()
    unexplained: tuple[str, ...] = ()     # differ from the published wheel, no known patch set's post-image explains them
    missing: tuple[str, ...] = ()         # in the published wheel, not there
    added: tuple[str, ...] = ()           # not in the wheel (rules: dspark_patch/references `compare`)
    unimported: tuple[str, ...] = ()      # other site folders with vLLM that no interpreter imports (not read; a finding)
    # Checked against the published wheel (references/): the wheel's file name, None when no
    # reference exists for this release and platform (then `unverified` says so: never clean).
    reference: str | None = None
    record_disagrees: tuple[str, ...] = ()  # the image's RECORD rows that differ from the wheel
    bytecode: tuple[str, ...] = ()          # .pyc whose header does not match its source: "path: why"
    unverified: tuple[str, ...] = ()        # what status could not prove (no reference; bytecode not verified)
    error: str | None = None              # why the image could not be read (the row's only content then)
    attested: tuple[tuple[str, AttestedState], ...] = ()  # with --key: per applied patch set
    attested_detail: tuple[str, ...] = ()  # why an attestation is missing or invalid, one line each
    exit_code: int = 0                    # 0 clean, 1 findings or no vLLM, 2 bad reference, 3 engine
    installer_metadata: tuple[str, ...] = ()  # the installer's own files, accepted by their shape
    installer_findings: tuple[str, ...] = ()  # "path: why": named like the installer's files, and not (a finding)
    # Never a finding: a variable the image sets that a known patch set introduced and the installed
    # release does not read (unread_env.py); status.json shows them in the run's notes, after the ref.
    notes: tuple[str, ...] = ()
    # Which route read the row and why (routing.py): a container, the engine's save of the layers,
    # the registry, or a folder; None only in a document written before routes were recorded.
    route: Route | None = None

    def __post_init__(self) -> None:
        # Why a row was not read, as evidence may hold it (report/evidence.py).
        if self.error is not None:
            object.__setattr__(self, "error", redact(self.error))
        if self.route is not None:   # a reason may name the reference, as evidence may hold it
            object.__setattr__(self, "route", Route(name=self.route.name, reason=redact(self.route.reason)))
        object.__setattr__(self, "attested_detail", redact_all(self.attested_detail))

    @property
    def findings(self) -> bool:
        if self.error is None and self.reference is None:
            return True  # no reference: nothing proves these files are the release's
        # A copy no interpreter imports is a finding too: apply refuses such an image and verify fails it.
        return bool(self.unexplained or self.missing or self.added or self.record_disagrees or self.bytecode
                    or self.unimported or self.installer_findings) or any(
            state in ("partial", "drifted") for _, state in self.patch_sets) or any(
            state == "invalid" for _, state in self.attested)


@dataclass(frozen=True, kw_only=True)
class ShardInfo:
    """`status --shard I/N`: which share of the whole target list this run read (status/shard.py)."""
    index: int                 # 0-based, as JOB_COMPLETION_INDEX
    count: int                 # N
    targets: int               # how many targets the whole (de-duplicated) list holds
    list_sha256: str           # the whole list, sorted: every shard of one run has the same
    positions: tuple[int, ...]  # each row's place in the whole list as given, in the order of `images`


@dataclass(frozen=True, kw_only=True)
class MergeInfo:
    """`report merge`: the shards a merged report was joined from."""
    count: int                 # N
    shards: tuple[int, ...]    # the indexes joined
    missing: tuple[int, ...]   # the indexes not given (only with --allow-partial): their targets are not here

    @property
    def partial(self) -> bool:
        return bool(self.missing)


@dataclass(frozen=True, kw_only=True)
class FleetStatus:
    images: tuple[ImageStatus, ...]
    tool_version: str
    started_at: str
    seconds: float
    schema: str = STATUS_SCHEMA
    # Every known patch set's id and content digest (patchset.content_sha256): what the states mean.
    patch_set_digests: tuple[tuple[str, str], ...] = ()
    shard: ShardInfo | None = None
    merged: MergeInfo | None = None
    # What the run could not use (cache entries not sealed here), and each row's notes ("REF: ..."): never a verdict.
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int:
        # The worse class wins: an engine problem over bad input over findings. A partial merge
        # proves nothing of its missing shards' targets: never 0.
        worst = max((i.exit_code for i in self.images), default=0)
        return max(worst, 1) if self.merged is not None and self.merged.partial else worst

    @property
    def patch_set_ids(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for image in self.images:
            for pid, _ in image.patch_sets:
                seen.setdefault(pid)
        return tuple(seen)
