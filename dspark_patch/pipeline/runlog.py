"""The run's mutable record, frozen into the AuditReport at the end; steps are timed here."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from .. import __version__, termination
from ..errors import DsparkPatchError
from ..report.model import (
    AuditReport,
    Command,
    DistributionInfo,
    ErrorReport,
    Status,
    StepReport,
    TargetReport,
)
from ..routing import Route
from ..targets.base import Distribution
from .requests import LocalSpec, TargetSpec

StepCallback = Callable[[StepReport], None]
# Called with the run's report (as it will read if naming the result succeeds) once the result is
# complete and before it is named: the CLI writes the report set there, so that a run whose
# reports cannot be written names nothing.
ResultCallback = Callable[[AuditReport], None]


@dataclass(kw_only=True)
class RunLog:
    """A run in progress: the report so far (`draft`), and the steps and notes as they come.

    The pipeline sets report fields with `update`; `report` freezes the draft with the outcome.
    """

    draft: AuditReport
    on_step: StepCallback | None
    steps: list[StepReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def start(cls, command: Command, target: TargetReport, on_step: StepCallback | None,
              route: Route | None = None) -> RunLog:
        # Until `report` says how it ended, a run counts as failed: a draft is never a success.
        draft = AuditReport(
            command=command,
            status="failed",
            exit_code=1,
            tool_version=__version__,
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
            target=target,
            route=route,
        )
        return cls(draft=draft, on_step=on_step)

    def update(self, **fields: Any) -> None:
        """Set fields of the report in progress (the names of `AuditReport`'s fields)."""
        self.draft = replace(self.draft, **fields)

    @contextmanager
    def step(self, name: str, *, unwinding: bool = False) -> Iterator[None]:
        """One named, timed step. A run told to stop (SIGTERM, Ctrl-C) starts no step and fails
        the one under way when it ends, whatever dropped the signal's exception; an `unwinding`
        step (putting back what the run wrote, as the run ends) runs all the same: a stop must
        not leave a half-written tree."""
        if not unwinding:
            termination.check()
        start = time.monotonic()
        try:
            yield
            if not unwinding:
                termination.check()
        except BaseException as exc:
            detail = exc.line() if isinstance(exc, DsparkPatchError) else type(exc).__name__
            self.record(StepReport(name=name, status="failed", seconds=time.monotonic() - start, detail=detail))
            raise
        self.record(StepReport(name=name, status="ok", seconds=time.monotonic() - start))

    def skipped(self, name: str, why: str) -> None:
        self.record(StepReport(name=name, status="skipped", seconds=0.0, detail=why))

    def record(self, step: StepReport) -> None:
        self.steps.append(step)
        if self.on_step is not None:
            self.on_step(step)

    def report(self, status: Status, error: DsparkPatchError | None = None) -> AuditReport:
        errors: tuple[ErrorReport, ...] = ()
        if error is not None:
            errors = (ErrorReport(kind=error.kind, message=error.message, hint=error.hint, exit_code=error.exit_code),)
        return replace(
            self.draft,
            status="failed" if error is not None else status,
            exit_code=error.exit_code if error is not None else 0,
            steps=tuple(self.steps),
            errors=errors,
            notes=tuple(self.notes),
        )


def target_report(spec: TargetSpec) -> TargetReport:
    if isinstance(spec, LocalSpec):
        return TargetReport(kind="local", ref=spec.root, python=spec.python)
    return TargetReport(kind="image", ref=spec.ref)


def with_distribution(report: TargetReport, dist: Distribution) -> TargetReport:
    return replace(report, python=dist.python, python_version=dist.python_version,
                   distribution=DistributionInfo(name=dist.name, version=dist.version, location=dist.location))
