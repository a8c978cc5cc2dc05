"""The pipeline: command line -> plan -> target -> report.

`commands` holds apply / verify / probe of one target; `platforms` runs them per platform of an
image index; `steps` the steps every target shares;
`image_steps` those of an image; `record` the run's record that becomes the AuditReport.
"""

from ..targets.base import PullCallback
from .attestation import AttestationRequest, verify_attestation
from .image_steps import LABEL_PREFIX

# The entry points dispatch an image index to `platforms`; anything else runs `commands` as is.
from .index_run import apply, probe, verify
from .requests import ApplyRequest, ImageSpec, LocalSpec, ProbeRequest, PullPolicy, TargetSpec, VerifyRequest
from .runlog import StepCallback

__all__ = [
    "LABEL_PREFIX", "ApplyRequest", "AttestationRequest", "ImageSpec", "LocalSpec", "ProbeRequest", "PullCallback", "PullPolicy",
    "StepCallback", "TargetSpec", "VerifyRequest", "apply", "probe", "verify", "verify_attestation",
]
