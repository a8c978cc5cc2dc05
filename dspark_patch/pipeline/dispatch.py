"""apply / verify / probe as the CLI calls them: the request's source is resolved once
(`resolve.py`), then run by the single-target core (`commands`) or, for an image index, by
`index_run`, which runs each platform through that same core with the same store.
"""

from __future__ import annotations

from functools import partial

from ..errors import DsparkPatchError
from ..report.model import AuditReport, Command
from ..targets.base import PullCallback
from . import commands, index_run
from .requests import ApplyRequest, ProbeRequest, VerifyRequest
from .resolve import IndexSource, resolve
from .runlog import ResultCallback, RunLog, StepCallback, target_report


def apply(request: ApplyRequest, *, on_step: StepCallback | None = None,
          on_pull: PullCallback | None = None, on_result: ResultCallback | None = None) -> AuditReport:
    """`on_result`: called with the report before a tagged result is named (runlog.ResultCallback):
    for an index, once, with the whole run's report, before the first platform image is named."""
    single = partial(commands.apply, on_pull=on_pull, on_result=on_result)
    if request.sign_key is None:
        return _dispatch("apply", request, single, on_step, on_result)
    from pathlib import Path

    from ..attest.dsse import load_signer
    from .attestation import sign_and_attach

    try:  # a key that cannot sign stops the run before any work
        signer = load_signer(Path(request.sign_key), allow_open=request.allow_open_key)
    except DsparkPatchError as exc:
        return RunLog.start("apply", target_report(request.target), on_step).report("failed", exc)
    return sign_and_attach(_dispatch("apply", request, single, on_step, on_result), signer, on_step)


def verify(request: VerifyRequest, *, on_step: StepCallback | None = None,
           on_pull: PullCallback | None = None) -> AuditReport:
    return _dispatch("verify", request, partial(commands.verify, on_pull=on_pull), on_step)


def probe(request: ProbeRequest, *, on_step: StepCallback | None = None,
          on_pull: PullCallback | None = None) -> AuditReport:
    return _dispatch("probe", request, partial(commands.probe, on_pull=on_pull), on_step)


def _dispatch(command: Command, request: index_run.Request, single: index_run.Single, on_step: StepCallback | None,
              on_result: ResultCallback | None = None) -> AuditReport:
    run = RunLog.start(command, target_report(request.target), on_step)
    try:
        source = resolve(request.target, run)
    except DsparkPatchError as exc:  # refused before any target was opened
        return run.report("failed", exc)
    if isinstance(source, IndexSource):
        run.update(route=source.route)
        return index_run.run_index(command, request, source, single, run, on_result)
    return single(request, source=source, on_step=on_step)


__all__ = ["apply", "probe", "verify"]
