"""The pipeline: command line -> plan -> target -> report.

`commands` holds apply / verify / probe of one target; `platforms` runs them per platform of an
image index; `steps` the steps every target shares;
`image_steps` those of an image; `record` the run's record that becomes the AuditReport.
"""

# The entry points dispatch an image index to `platforms`; anything else runs `commands` as is.
from .platforms import apply, probe, verify
from .image_steps import LABEL_PREFIX
from .record import StepCallback
from .requests import ApplyRequest, ImageSpec, LocalSpec, ProbeRequest, TargetSpec, VerifyRequest

__all__ = [
    "LABEL_PREFIX", "ApplyRequest", "ImageSpec", "LocalSpec", "ProbeRequest", "StepCallback", "TargetSpec",
    "VerifyRequest", "apply", "probe", "verify",
]
