"""`dspark-patch port`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ..errors import BadInput
from . import common, output

if TYPE_CHECKING:
    from ..report.port_model import PortReport


def register(app: typer.Typer) -> None:
    app.command("port")(port)


def port(
    to: Annotated[str, typer.Option("--to", help="The release to make a variant for, e.g. 0.32.0.")],
    patch: common.PatchesOpt = None,
    series: common.SeriesOpt = None,
    wheel: Annotated[Path | None, typer.Option("--wheel", help="The release's wheel file (default, with no --root or --image: pip download --no-deps vllm==RELEASE into a temporary folder).")] = None,
    root: common.RootOpt = None,
    image: common.ImageOpt = None,
    source_variant: Annotated[str | None, typer.Option("--from", help="The variant to carry (default: the patch set's own, not ported, variant).")] = None,
    work: Annotated[Path | None, typer.Option("--work", help="The work folder (default ./dspark-patch-port/ID-RELEASE); run the same command again after resolving conflicts there.")] = None,
    python: common.PythonOpt = None,
    pull: common.PullOpt = "missing",
    as_json: Annotated[bool, typer.Option("--json", help="Print what the port did as JSON on stdout and nothing else.")] = False,
) -> None:
    """Make a candidate variant of a patch set for another release: an exact three-way merge
    (never fuzz), conflicts left for a person, then compile and probe checks; the variant is
    written "unreviewed", with a review file. A series (--patch several times, or --series) is
    ported in order, each set onto the release with the sets before it applied, each in a work
    folder of its own under --work; a set that already has a variant for the release is used as
    it is."""
    from ..pipeline.port import port as run_port
    from ..pipeline.port import port_series
    from ..pipeline.requests import PortRequest

    request = PortRequest(
        release=to, patch=patch[0] if patch else None, wheel=None if wheel is None else str(wheel),
        root=None if root is None else str(root), image=image, python=python, pull=common.pull_policy(pull),
        source_variant=source_variant, work=None if work is None else str(work),
    )
    one_set = series is None and len(patch or ()) <= 1
    if one_set:
        reports: tuple[PortReport, ...] = (run_port(request),)
    else:
        if source_variant is not None:
            raise BadInput("--from names one patch set's variant; a series ports each set from its own",
                           hint="drop --from, or port that set alone")
        reports = port_series(request, tuple(patch or ()), None if series is None else str(series))
    if as_json:
        from ..serialise import dumps

        output.print_json(dumps(reports[0] if one_set else {"series": list(reports)}))
    else:
        for report in reports:
            _render(report)
    last = reports[-1]
    if last.error is not None:
        output.error_line_text(last.error.message + (f" ({last.error.hint})" if last.error.hint else ""))
    raise typer.Exit(last.exit_code)


def _render(report: PortReport) -> None:
    from ..pipeline.port import reader_line

    if report.status == "covered":
        output.line(f"port {report.patch} -> {report.release}: covered (variant {report.variant}, used as it is)")
        return
    output.line(f"port {report.patch or '?'} {report.source_variant or '?'} -> {report.release}: {report.status} "
                f"(work folder {report.work})")
    for f in report.files:
        where = ", ".join(f"hunk #{i} offset {o:+d}" for i, o in enumerate(f.offsets, 1))
        output.line(f"  {f.path}: {f.status}{' (' + where + ')' if where else ''}")
        for line in f.conflicts:
            output.line(f"  conflict: {line}")
    if report.superseded_candidate:
        output.line(f"  {report.release} appears to ship the change: the effect cases pass on the pristine release")
        for w in report.ships_change:
            output.line(f"  decided at: {w}")
        for b in report.behaviour:
            output.line(f"  differs: {b}")
        output.line(f"  wrote an unreviewed superseded record: {report.superseded_candidate}")
    for e in report.unguarded:
        output.line(f"  unguarded reader: {reader_line(e)}: {e.verdict}")
    if report.probe is not None and report.probe.ran:
        output.line(f"  probe: {'passed' if report.probe.ok else 'FAILED: ' + report.probe.detail}")
    if report.variant:
        output.line(f"  wrote variant {report.variant} (review = \"unreviewed\"): {report.diff_path}")
        output.line(f"  review file: {report.review_path}")
