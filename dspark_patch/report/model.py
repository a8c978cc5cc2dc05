"""The audit report: a frozen record of what happened, built once at the end of a run.

Renderers (JSON, Markdown, JUnit, in-toto) are small functions over this model in
`report.render`; the JSON is this model through the shared encoder (`dspark_patch.serialise`),
versioned (`SCHEMA`) and described by the JSON Schema shipped beside this module
(`audit.schema.json`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ..routing import Route
from .evidence import redact, redact_all

SCHEMA = "dspark-patch/audit/v1"

Status = Literal["applied", "already-applied", "verified", "dry-run", "probed", "failed"]
Command = Literal["apply", "verify", "probe"]
StepStatus = Literal["ok", "failed", "skipped"]


@dataclass(frozen=True, kw_only=True)
class DistributionInfo:
    name: str
    version: str
    location: str


@dataclass(frozen=True, kw_only=True)
class ImageRecord:
    """An image as the report names it (the parsed reference type is `dspark_patch.imageref.ImageRef`)."""

    ref: str
    id: str                         # the image id (config digest), "sha256:<hex>"
    # The registry's manifest digest ("repo@sha256:<hex>") once pushed: what cosign and
    # admission policies key on, and it differs from `id`. None until the image is pushed.
    repo_digest: str | None = None


@dataclass(frozen=True, kw_only=True)
class TargetReport:
    kind: Literal["local", "image"]
    ref: str
    python: str | None = None
    python_version: str | None = None
    distribution: DistributionInfo | None = None
    image: ImageRecord | None = None


@dataclass(frozen=True, kw_only=True)
class PatchReport:
    id: str | None            # None for a bare diff file
    variant: str | None
    sha256: str               # of the diff bytes
    # The diff's path inside its patch set's folder ("vllm-0.33.0.patch"; a bare diff: its file
    # name): the same on every machine, never where the checkout happens to be.
    source: str
    hash_checks: bool         # False for a bare diff or --allow-unknown-base
    # The variant's review state from patch.toml (None for a bare diff); "unreviewed" only
    # reaches an applied report with --allow-unreviewed.
    review: Literal["reviewed", "unreviewed"] | None = None


@dataclass(frozen=True, kw_only=True)
class HunkReport:
    index: int
    source_start: int
    applied_at: int
    offset: int
    fuzz: int


@dataclass(frozen=True, kw_only=True)
class FileReport:
    path: str
    action: Literal["modify", "add", "delete"]
    pre_sha256: str | None
    post_sha256: str | None
    expected_pre_sha256: str | None = None
    expected_post_sha256: str | None = None
    hunks: tuple[HunkReport, ...] = ()


@dataclass(frozen=True, kw_only=True)
class CompiledFile:
    path: str
    ok: bool
    detail: str = ""


@dataclass(frozen=True, kw_only=True)
class CompileReport:
    ok: bool
    ran: bool
    files: tuple[CompiledFile, ...] = ()


@dataclass(frozen=True, kw_only=True)
class ProbeCase:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, kw_only=True)
class CensusEntry:
    """One reference the probe found to the buffer, its accessor or the drafter helper."""

    file: str
    line: int
    function: str
    symbol: str
    kind: str
    reached: bool      # on the DSpark Model Runner V2 path
    none_safe: bool    # guarded, passed on by an accessor, or through the helper's fallback
    verdict: str


ProbeClaim = Literal["", "in-image job"]
# How the probe of a signed predicate stands (verify --attestation): run by the signing run itself,
# claimed by an in-image job (publish), or not run.
ProbeStanding = Literal["proven", "claimed", "not-run"]


@dataclass(frozen=True, kw_only=True)
class ProbeReport:
    ok: bool
    ran: bool
    cases: tuple[ProbeCase, ...] = ()
    # Every reader the probe's claim rests on (empty for a probe that reports none).
    census: tuple[CensusEntry, ...] = ()
    detail: str = ""
    # The probe is the patch set's code: which files it was (and the sha256 of the one source
    # sent), and where it ran (the host, with the environment it was given, or a container).
    source: str = ""
    ran_in: str = ""
    # Where the tree makes the decision the probe's effect case ran ("path:function"; empty for a
    # probe that names none): what `port` writes into a candidate superseded record.
    where: tuple[str, ...] = ()
    # Who says the result above when the run that wrote this report did not see the probe run:
    # "in-image job" where `publish` carried the in-image job's result (it has no engine to run
    # it again), so a signed predicate labels it a claim, never a fact; "" where this report's
    # own run ran it (apply, verify, probe), or it did not run.
    claimed_by: ProbeClaim = ""


@dataclass(frozen=True, kw_only=True)
class SupersededReport:
    """A patch set the installed release makes unnecessary (patch.toml `[[superseded]]`): proven
    by the record's files and its effect cases, run on the pristine release (the run's `probe`)."""

    id: str
    record: str                     # the record's name, e.g. "vllm-0.34.0"
    release: str
    upstream: str                   # what the release does instead
    where: tuple[str, ...]          # "path:function" entries
    review: Literal["reviewed", "unreviewed"]
    effect_cases: tuple[str, ...]   # the probe cases that proved it (their results are in `probe`)


@dataclass(frozen=True, kw_only=True)
class IntegrityReport:
    """RECORD integrity of the distribution's own files other than the patched ones."""

    checked: int
    mismatched: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()
    not_checked: tuple[str, ...] = ()   # entries pointing outside `location`, never followed
    stale_bytecode: tuple[str, ...] = ()
    # Files the published wheel does not hold inside the distribution's own folders, startup
    # hooks and unknown .pth files at the site folder's top (rules: dspark_patch/references `compare`).
    added: tuple[str, ...] = ()
    reference: str | None = None          # the published wheel checked against; None: none known (a failure)
    record_disagrees: tuple[str, ...] = ()  # the target's RECORD rows that differ from the wheel
    unverified: tuple[str, ...] = ()      # "no reference for vllm X …"
    bytecode_checked: int = 0             # .pyc files the interpreter would load, recompiled and compared
    bytecode_proofs_reused: int = 0       # of those, proven by a proof kept from an earlier check (no compile)
    kept_answer: bool = False             # an image's answer kept by its id from an earlier check (targets/caches/answers.py); nothing ran
    notes: tuple[str, ...] = ()           # kept for the schema; empty since bytecode that is not its source's is stale_bytecode
    # The installer's own files (dist-info metadata, console scripts), accepted by their shape
    # (references/installer.py), and "path: why" for files named like them that are not.
    installer_metadata: tuple[str, ...] = ()
    installer_findings: tuple[str, ...] = ()
    # Modules (.py) the interpreter has no bytecode of: uv compiles none, and a user who cannot
    # write __pycache__ compiles them at every start. Not a finding; said so the report shows it.
    modules_without_bytecode: int = 0


@dataclass(frozen=True, kw_only=True)
class LayerChange:
    kind: Literal["A", "C", "D"]
    path: str


@dataclass(frozen=True, kw_only=True)
class LayerReport:
    ok: bool
    changes: tuple[LayerChange, ...] = ()
    unexpected: tuple[LayerChange, ...] = ()
    # The layer tar's sha256 ("sha256:<hex>", its diff_id in the image config) and size in bytes:
    # what `apply --root --layer-out` wrote, or what `apply --image` appended.
    diff_id: str | None = None
    size: int | None = None


@dataclass(frozen=True, kw_only=True)
class StepReport:
    name: str
    status: StepStatus
    seconds: float
    detail: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "detail", redact(self.detail))   # report/evidence.py


@dataclass(frozen=True, kw_only=True)
class ErrorReport:
    kind: str
    message: str
    hint: str | None
    exit_code: int

    def __post_init__(self) -> None:
        # The error line as evidence may hold it (report/evidence.py); stderr prints the
        # exception's own line.
        object.__setattr__(self, "message", redact(self.message))
        object.__setattr__(self, "hint", None if self.hint is None else redact(self.hint))


@dataclass(frozen=True, kw_only=True)
class IndexReport:
    """The image index a multi-platform run started from, and the one it published."""

    ref: str                        # registry/repo:tag (or @digest) as the user named it
    media_type: str                 # OCI image index or Docker manifest list; the new one is the same kind
    digest: str                     # sha256:... of the source index as served
    platforms: tuple[str, ...]      # every platform it lists, in its order (attestations are not platforms)
    result_ref: str | None = None   # where the patched index was pushed (--tag with --push)
    result_digest: str | None = None


@dataclass(frozen=True, kw_only=True)
class PlatformReport:
    """One platform of an index run: its manifest before and after, and its own full audit."""

    platform: str                   # linux/arm64/v8, as the index writes it
    source_manifest: str            # sha256:... the source index names for it
    emulated: bool                  # its compile and probe ran under emulation on the engine
    report: AuditReport             # files, hunks, compile, probe, layer, result image, steps
    result_manifest: str | None = None  # sha256:... of the pushed patched image


AttestationState = Literal["attached", "valid", "none", "invalid"]


@dataclass(frozen=True, kw_only=True)
class AttestationReport:
    """A signed attestation in the registry, for one manifest: attached by `apply --sign-key`, or
    looked for by `verify --attestation` (valid, none found, or invalid and why)."""

    subject: str                    # repo@sha256:... of the image manifest or index it is about
    state: AttestationState
    keyid: str                      # sha256 (hex) of the public key's DER SubjectPublicKeyInfo
    artifact: str | None = None     # sha256:... of the attestation artifact's manifest
    via: Literal["referrers-api", "fallback-tag"] | None = None
    detail: str = ""                # why it is invalid or missing; empty when it holds
    # verify --attestation, of a valid one: how the predicate's probe stands (the weakest of an
    # index's platforms); None when none holds, or when attached rather than checked.
    probe: ProbeStanding | None = None


CheckOutcome = Literal["passed", "failed", "skipped"]


@dataclass(frozen=True, kw_only=True)
class CheckCase:
    """One check, as every format shows it: its group, name, outcome and why (report/checks.py
    derives them; the pipeline records them in the report)."""

    group: str           # pre-image, placement, post-image, compile, probe, ... (JUnit's classname)
    name: str
    outcome: CheckOutcome
    message: str = ""    # one line: why it failed or was skipped
    detail: str = ""     # the longer evidence (JUnit: the failure's body)


@dataclass(frozen=True, kw_only=True)
class AuditReport:
    # Field order is audit.json's key order: the verdict, the target, the patch, the evidence.
    schema: str = SCHEMA
    command: Command
    status: Status
    exit_code: int
    tool_version: str
    started_at: str             # ISO 8601, UTC
    target: TargetReport
    # Which route judged the target and why (routing.py): a container of the image on the engine,
    # its layers from the registry, a folder, or an in-image run; None for a run refused before
    # one was chosen, or a report written before routes were recorded.
    route: Route | None = None
    result_image: ImageRecord | None = None
    patch: PatchReport | None = None
    # A series of several patch sets: each member in order (`patch` then names the series as a
    # whole, its id and variant the members' joined by "+"); empty for one patch set.
    series: tuple[PatchReport, ...] = ()
    # Patch sets named that the installed release ships in its own form: skipped, with the proof.
    superseded: tuple[SupersededReport, ...] = ()
    files: tuple[FileReport, ...] = ()
    compile: CompileReport = field(default_factory=lambda: CompileReport(ok=True, ran=False))
    probe: ProbeReport = field(default_factory=lambda: ProbeReport(ok=True, ran=False))
    integrity: IntegrityReport | None = None
    layer: LayerReport | None = None
    # An object in audit.json, not pairs: that is how `docker inspect` shows labels and how
    # policies read them.
    labels: Mapping[str, str] = field(default_factory=dict)
    # A run over an image index: the index, and one full report per platform (in index order);
    # the fields above then describe no single image, and the verdict is the whole run's.
    index: IndexReport | None = None
    platforms: tuple[PlatformReport, ...] = ()
    # Signed attestations attached (`apply --sign-key`) or checked (`verify --attestation`).
    attestations: tuple[AttestationReport, ...] = ()
    # Every check of the run (report/checks.py), recorded once by the pipeline when the run ends:
    # audit.md, junit.xml and the attestation render this list, so they agree by construction.
    # Empty only in a report written before checks were recorded (then the renderers derive it).
    checks: tuple[CheckCase, ...] = ()
    steps: tuple[StepReport, ...] = ()
    errors: tuple[ErrorReport, ...] = ()
    notes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "notes", redact_all(self.notes))   # report/evidence.py
        if self.route is not None:   # a reason may name an image reference, as evidence may hold it
            object.__setattr__(self, "route", Route(name=self.route.name, reason=redact(self.route.reason)))

    @property
    def ok(self) -> bool:
        return self.exit_code == 0
