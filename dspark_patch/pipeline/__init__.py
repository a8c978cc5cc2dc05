"""The pipeline: command line -> plan -> target -> report.

`dispatch` holds apply / verify / probe: `resolve` decides once what the request names,
`commands` runs one target, `index_run` runs that core per platform of an image index; `shared_steps`
the steps every target shares; `integrity_check` the tree against the published wheel;
`image_steps` those of an image; `runlog` the run's record that becomes the AuditReport, whose
checks are recorded here as the run ends.
"""

from typing import TYPE_CHECKING, Any

from ..report.checks import record_checks
from ..report.model import AuditReport
from ..targets.base import PullCallback
from . import dispatch
from .commands import withdraw
from .image_steps import LABEL_PREFIX
from .requests import ApplyRequest, ImageSpec, LocalSpec, ProbeRequest, PullPolicy, TargetSpec, VerifyRequest
from .runlog import ResultCallback, StepCallback

# The entry points resolve the request's source once (resolve.py), then run it: an image index
# through `index_run`'s platform loop, anything else through `commands`. Every report they hand
# out (the drafts given to `on_result` too) holds its checks, recorded as the run ends
# (report/checks.py): what audit.json, audit.md and junit.xml show.


def _recording(on_result: ResultCallback) -> ResultCallback:
    return lambda draft: on_result(record_checks(draft))


def apply(request: ApplyRequest, *, on_step: StepCallback | None = None, on_pull: PullCallback | None = None,
          on_result: ResultCallback | None = None) -> AuditReport:
    return record_checks(dispatch.apply(request, on_step=on_step, on_pull=on_pull,
                                        on_result=_recording(on_result) if on_result is not None else None))


def verify(request: VerifyRequest, *, on_step: StepCallback | None = None,
           on_pull: PullCallback | None = None) -> AuditReport:
    return record_checks(dispatch.verify(request, on_step=on_step, on_pull=on_pull))


def probe(request: ProbeRequest, *, on_step: StepCallback | None = None,
          on_pull: PullCallback | None = None) -> AuditReport:
    return record_checks(dispatch.probe(request, on_step=on_step, on_pull=on_pull))


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
