"""What the CLI asks the pipeline to do: frozen requests, one per command."""

from __future__ import annotations

from dataclasses import dataclass

from ..imageref import ImageRef
from ..targets.base import PullPolicy


@dataclass(frozen=True, kw_only=True)
class LocalSpec:
    root: str
    python: str | None = None


@dataclass(frozen=True, kw_only=True)
class ImageSpec:
    ref: str                     # name:tag, name@sha256:… or an image id
    python: str | None = None    # None: the interpreter that owns vLLM is found in the image
    pull: PullPolicy = "missing"
    tag: str | None = None
    force: bool = False
    push: bool = False
    # For an image index in a registry: `linux/amd64`, a comma list, or `all`; None is the
    # engine's own platform (pipeline/index_run.py).
    platform: str | None = None

    def __post_init__(self) -> None:
        # Read before any work (BadInput, exit 2): a malformed --tag found after the commit, or a
        # reference with a password in it reaching the engine, the reports and their errors.
        if not ImageRef.is_image_id(self.ref):
            ImageRef.parse(self.ref)
        if self.tag is not None:
            ImageRef.parse(self.tag)


TargetSpec = LocalSpec | ImageSpec


@dataclass(frozen=True, kw_only=True)
class ApplyRequest:
    target: TargetSpec
    # The series, in order: each `--patch` (none: the shipped default), or a series file (series.py).
    patches: tuple[str, ...] = ()
    series: str | None = None
    strip: int | None = None
    dry_run: bool = False
    compile: bool = True
    probe: bool = True
    allow_unknown_base: bool = False
    allow_unreviewed: bool = False
    # An image's layers through the strict layer reader even where the scan cache lacks them
    # (a save of the whole image); without it only cached scans are read (image_steps.LayerCheck).
    strict_layers: bool = False
    # A local tree: also write the layer the patched files make (a tar) here, for `publish`.
    layer_out: str | None = None
    # A private key (PEM): after the push, the in-toto statement is signed with it (DSSE) and
    # attached to each pushed manifest in the registry (pipeline/attestation.py).
    sign_key: str | None = None
    allow_open_key: bool = False   # sign with a key group or others may read (refused otherwise)


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    target: TargetSpec
    patches: tuple[str, ...] = ()
    series: str | None = None
    strip: int | None = None
    probe: bool = True


@dataclass(frozen=True, kw_only=True)
class ProbeRequest:
    target: TargetSpec
    patch: str | None = None   # whose probe to run; default: dspark-skip-mtp-buffer


@dataclass(frozen=True, kw_only=True)
class PortRequest:
    """`port`: carry a variant of a patch set to another release (exactly one source of files)."""

    release: str
    patch: str | None = None
    wheel: str | None = None
    root: str | None = None
    image: str | None = None
    python: str | None = None
    pull: PullPolicy = "missing"
    source_variant: str | None = None
    work: str | None = None
