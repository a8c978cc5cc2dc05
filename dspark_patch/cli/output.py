"""How results reach people and machines: rich on a terminal, plain lines otherwise, JSON on demand."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TaskID, TextColumn
from rich.table import Table

from ..errors import DsparkPatchError
from ..report.model import AuditReport, StepReport
from ..targets.base import PullCallback, PullProgress

# Progress and summaries go to stderr so that stdout stays clean for --json.
_err = Console(stderr=True, highlight=False, soft_wrap=True)
_out = Console(highlight=False, soft_wrap=True)
# status's table: not on a terminal (a CI log, a file), wide enough that image refs are not
# folded into slivers.
_wide = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
# evaluate's summaries, with rich's own defaults.
_rich = Console()
# verify --attestation: how a valid attestation's probe stands (report/model.py ProbeStanding).
_PROBE_STANDING = {"proven": "run by the signing run", "not-run": "not run",
                   "claimed": "claimed by the in-image job, not verified by the publisher"}


# --- what the commands' own renderers print through (this module is the only one that prints) ---
def show(*things: Any, markup: bool = True) -> None:
    """Rich text or renderables on stdout."""
    _out.print(*things, markup=markup)


def show_wide(*things: Any, markup: bool = True) -> None:
    """Rich text or renderables on stdout, 200 columns wide off a terminal (status)."""
    _wide.print(*things, markup=markup)


def show_rich(*things: Any) -> None:
    """Rich text or renderables on stdout with rich's default console (evaluate)."""
    _rich.print(*things)


def show_err(*things: Any, markup: bool = True) -> None:
    """Rich text on stderr (progress)."""
    _err.print(*things, markup=markup)


def stderr_is_terminal() -> bool:
    return bool(_err.is_terminal)


def line(text: str, *, err: bool = False, flush: bool = False) -> None:
    """One plain line, no markup (stdout, or stderr with `err`)."""
    print(text, file=sys.stderr if err else sys.stdout, flush=flush)


def write(text: str) -> None:
    """Text on stdout exactly as given (a JSON document)."""
    sys.stdout.write(text)


def error_line(exc: DsparkPatchError) -> None:
    error_line_text(exc.line())


def error_line_text(text: str) -> None:
    print(f"dspark-patch: error: {text}", file=sys.stderr)


def step_printer(enabled: bool):
    """A pipeline `on_step` callback showing each step live with its time (terminals only;
    elsewhere the steps are listed once in the closing summary)."""
    if not enabled or not _err.is_terminal:
        return None

    def show(step: StepReport) -> None:
        mark = {"ok": "✓", "failed": "✗", "skipped": "–"}[step.status]
        colour = {"ok": "green", "failed": "red", "skipped": "dim"}[step.status]
        extra = f"  {step.detail}" if step.detail and step.status == "skipped" else ""
        _err.print(f"[{colour}]{mark}[/] {step.name:<14} {step.seconds:6.2f}s{extra}")

    return show


@contextmanager
def pull_display() -> Iterator[PullCallback]:
    """Shows an image pull while it runs (stderr): a rich bar per layer on a terminal, one line
    per layer step elsewhere (CI logs), so a slow pull never looks like a hang."""
    if _err.is_terminal:
        # Bars only while a pull runs: the live display must not sit under the step lines.
        bars = Progress(TextColumn("{task.description}"), BarColumn(), DownloadColumn(), console=_err, transient=True)
        tasks: dict[str, TaskID] = {}

        def show_bars(event: PullProgress) -> None:
            if event.done:
                bars.stop()
                tasks.clear()
            elif event.layer is None:
                _err.print(f"[dim]pull[/] {event.ref}: {event.status}")
            else:
                if not tasks:
                    bars.start()
                if event.layer not in tasks:
                    tasks[event.layer] = bars.add_task(event.layer, total=None)
                bars.update(tasks[event.layer], description=f"{event.layer} {event.status}",
                            completed=event.current or 0, total=event.total)

        try:
            yield show_bars
        finally:
            bars.stop()
        return
    last: dict[str | None, str] = {}

    def show_lines(event: PullProgress) -> None:
        if event.done or last.get(event.layer) == event.status:  # progress ticks repeat the step's name
            return
        last[event.layer] = event.status
        where = f" {event.layer}" if event.layer else ""
        print(f"pull {event.ref}:{where} {event.status}", file=sys.stderr, flush=True)

    yield show_lines


def summary(report: AuditReport, report_dir: Path | None) -> None:
    """One closing summary for people (stderr). Bad input and environment problems get only
    their one error line (printed by the caller), not a table around it."""
    if report.exit_code in (2, 3):
        return
    verdict = "OK" if report.ok else "FAILED"
    rows = [("verdict", f"{verdict}: {report.status}")]
    t = report.target
    rows.append(("target", f"{t.kind} {t.ref}" + (f" ({t.image.id[:19]})" if t.image else "")))
    if report.route is not None:
        rows.append(("route", f"{report.route.name}: {report.route.reason}"))
    if report.index is not None:
        rows += _index_rows(report)
    if t.distribution:
        rows.append(("release", f"{t.distribution.name} {t.distribution.version} at {t.distribution.location}"))
    if report.series:
        rows.append(("series", ", ".join(f"{m.id} ({m.variant})" for m in report.series)))
    elif report.patch:
        rows.append(("patch", f"{report.patch.id or 'bare diff'} {report.patch.variant or ''}".strip()))
    for f in report.files:
        if f.hunks:
            offsets = ",".join(str(h.offset) for h in f.hunks)
            rows.append(("file", f"{f.path}  {len(f.hunks)} hunks at offsets {offsets}, fuzz 0"))
        elif f.expected_post_sha256 is not None:
            state = "post-image" if f.post_sha256 == f.expected_post_sha256 else "NOT the post-image"
            rows.append(("file", f"{f.path}  {state} (sha256 {(f.post_sha256 or 'missing')[:16]}…)"))
        else:
            rows.append(("file", f.path))
    if report.compile.ran:
        rows.append(("compile", "ok" if report.compile.ok else "FAILED"))
    if report.probe.ran:
        passed = sum(c.ok for c in report.probe.cases)
        rows.append(("probe", f"{passed}/{len(report.probe.cases)} cases pass" + ("" if report.probe.ok else f"  {report.probe.detail}")))
    if report.integrity:
        i = report.integrity
        against = f"against {i.reference}" if i.reference else "(no published wheel known to check against)"
        rows.append(("integrity", f"{i.checked} files checked {against}, {len(i.mismatched)} mismatched, "
                                  f"{len(i.missing)} missing, {len(i.added)} added, {len(i.record_disagrees)} RECORD rows "
                                  f"disagree, {_bytecode(i)}, {len(i.installer_metadata)} installer files"
                                  + (f" ({len(i.installer_findings)} not in an installer's shape)"
                                     if i.installer_findings else "")))
    if report.layer:
        rows.append(("layer", f"{len(report.layer.changes)} changes" + ("" if report.layer.ok else f", {len(report.layer.unexpected)} unexpected")))
    if report.result_image:
        rows.append(("result image", f"{report.result_image.ref} ({report.result_image.id[:19]})"))
    for a in report.attestations:
        rows.append(("attestation", f"{a.state} {a.subject} (key {a.keyid[:16]}, {a.via or 'no listing'})"
                     + (f": {a.detail}" if a.detail else "") + (f"; probe {_PROBE_STANDING[a.probe]}" if a.probe else "")))
    for note in report.notes:
        rows.append(("note", note))
    if report_dir is not None:
        rows.append(("report", str(report_dir / "audit.json")))
    if _err.is_terminal:
        table = Table(show_header=False, box=None, padding=(0, 1))
        for key, value in rows:
            table.add_row(f"[bold]{key}[/]", value)
        _err.print(table)
    else:
        for step in report.steps:
            print(f"step {step.name}: {step.status} ({step.seconds:.2f}s)" + (f" {step.detail}" if step.status == "skipped" else ""), file=sys.stderr)
        for key, value in rows:
            print(f"{key}: {value}", file=sys.stderr)


def _index_rows(report: AuditReport) -> list[tuple[str, str]]:
    index = report.index
    assert index is not None
    rows = [("index", f"{index.ref} ({index.digest[:19]}): {', '.join(index.platforms)}")]
    for p in report.platforms:
        r = p.report
        facts = [f"{'OK' if r.ok else 'FAILED'}: {r.status}"]
        if p.emulated:
            facts.append("emulated")
        if r.probe.ran:
            facts.append(f"probe {sum(c.ok for c in r.probe.cases)}/{len(r.probe.cases)}")
        if r.layer is not None:
            facts.append(f"layer {len(r.layer.changes)} changes")
        if r.result_image is not None:
            facts.append(f"-> {r.result_image.ref}")
        if r.errors:
            facts.append(r.errors[0].message)
        rows.append((p.platform, ", ".join(facts)))
    if index.result_digest:
        rows.append(("new index", f"{index.result_ref} ({index.result_digest})"))
    return rows


def print_json(text: str) -> None:
    sys.stdout.write(text if text.endswith("\n") else text + "\n")
    sys.stdout.flush()


def print_text(text: str) -> None:
    _out.print(text, markup=False)


def _bytecode(i) -> str:
    without = f", {i.modules_without_bytecode} modules without bytecode" if i.modules_without_bytecode else ""
    if i.kept_answer:
        return f"{i.bytecode_checked} .pyc proven (this image's answer, kept by its id from an earlier check){without}"
    if i.bytecode_proofs_reused:
        fresh = i.bytecode_checked - i.bytecode_proofs_reused
        return f"{i.bytecode_checked} .pyc proven ({i.bytecode_proofs_reused} by a kept proof, {fresh} recompiled){without}"
    return f"{i.bytecode_checked} .pyc recompiled{without}"
