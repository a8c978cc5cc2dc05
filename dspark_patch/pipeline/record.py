"""The run's mutable record, frozen into the AuditReport at the end; steps are timed here."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from typing import Literal

from .. import __version__
from ..errors import DsparkPatchError
from ..report.model import (
    AuditReport,
    CompileReport,
    DistributionInfo,
    ErrorReport,
    FileReport,
    ImageRef,
    IntegrityReport,
    LayerReport,
    PatchReport,
    ProbeReport,
    Status,
    StepReport,
    TargetReport,
)
from ..targets.base import Distribution
from .requests import LocalSpec, TargetSpec


StepCallback = Callable[[StepReport], None]


@dataclass(kw_only=True)
class RunRecord:
    command: Literal["apply", "verify", "probe"]
    target: TargetReport
    on_step: StepCallback | None
    started_at: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    patch: PatchReport | None = None
    files: tuple[FileReport, ...] = ()
    compile: CompileReport = field(default_factory=lambda: CompileReport(ok=True, ran=False))
    probe: ProbeReport = field(default_factory=lambda: ProbeReport(ok=True, ran=False))
    integrity: IntegrityReport | None = None
    layer: LayerReport | None = None
    result_image: ImageRef | None = None
    labels: tuple[tuple[str, str], ...] = ()
    steps: list[StepReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        start = time.monotonic()
        try:
            yield
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
        return AuditReport(
            command=self.command,
            status="failed" if error is not None else status,
            exit_code=error.exit_code if error is not None else 0,
            tool_version=__version__,
            started_at=self.started_at,
            target=self.target,
            patch=self.patch,
            files=self.files,
            compile=self.compile,
            probe=self.probe,
            integrity=self.integrity,
            layer=self.layer,
            result_image=self.result_image,
            labels=self.labels,
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
