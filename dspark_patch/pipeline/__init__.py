"""The pipeline: command line -> plan -> target -> report.

`commands` holds apply / verify / probe of one target; `platforms` runs them per platform of an
image index; `steps` the steps every target shares; `integrity_check` the tree against the
published wheel; `image_steps` those of an image; `record` the run's record that becomes the AuditReport.
"""

from typing import TYPE_CHECKING, Any

from ..targets.base import PullCallback

# The entry points dispatch an image index to `platforms`; anything else runs `commands` as is.
from .commands import withdraw
from .image_steps import LABEL_PREFIX
from .index_run import apply, probe, verify
from .requests import ApplyRequest, ImageSpec, LocalSpec, ProbeRequest, PullPolicy, TargetSpec, VerifyRequest
from .runlog import StepCallback

if TYPE_CHECKING:
    from .attestation import AttestationRequest, verify_attestation


def __getattr__(name: str) -> Any:
    # The attestation check (cryptography, the registry client) is imported when it is asked
    # for, not by every command that imports the pipeline: a tenth of a second of each start.
    if name in ("AttestationRequest", "verify_attestation"):
        from . import attestation

        return getattr(attestation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "LABEL_PREFIX", "ApplyRequest", "AttestationRequest", "ImageSpec", "LocalSpec", "ProbeRequest", "PullCallback", "PullPolicy",
    "StepCallback", "TargetSpec", "VerifyRequest", "apply", "probe", "verify", "verify_attestation", "withdraw",
]
