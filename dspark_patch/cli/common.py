"""Options and steps shared by several commands (one place, like auditwheel's main.py)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from ..errors import BadInput, DsparkPatchError, EnvironmentProblem
from ..pipeline import ImageSpec, LocalSpec, PullPolicy, TargetSpec
from ..report.model import AuditReport
from . import output

DEFAULT_REPORTS = Path("dspark-patch-reports")

RootOpt = Annotated[Path | None, typer.Option("--root", help="A site-packages folder that holds vllm and its dist-info.")]
ImageOpt = Annotated[str | None, typer.Option("--image", help="An image reference (name:tag, name@sha256:… or id).")]
PythonOpt = Annotated[str | None, typer.Option("--python", help="Interpreter that owns vLLM: for --root, one on this machine (default: this one); for --image, a path inside the image (default: found there).")]
PullOpt = Annotated[str, typer.Option("--pull", help="missing (default, as docker run): pull an image the engine lacks; always; never. Credentials come from the docker config (docker login, DOCKER_CONFIG).")]
PatchOpt = Annotated[str | None, typer.Option("--patch", help="Patch-set id, patch-set folder, or a bare diff file. Default: dspark-skip-mtp-buffer.")]
PatchesOpt = Annotated[list[str] | None, typer.Option("--patch", help="Patch-set id, patch-set folder, or a bare diff file; give it once per patch set of a series, in order. Default: dspark-skip-mtp-buffer.")]
SeriesOpt = Annotated[Path | None, typer.Option("--series", help="A series file: one patch set per line (id, folder or diff), in order; '#' starts a comment. Instead of --patch.")]
StripOpt = Annotated[int | None, typer.Option("--strip", min=0, help="Leading path components to strip, like patch -pN (default: the patch set's, 1).")]
NoProbeOpt = Annotated[bool, typer.Option("--no-probe", help="Skip the patch set's CPU probe.")]
ReportDirOpt = Annotated[Path | None, typer.Option("--report-dir", help="Write audit.json, audit.md, junit.xml (and the attestation) here. Default: ./dspark-patch-reports/<command>-<time>.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the audit report as JSON on stdout and nothing else.")]
PlatformOpt = Annotated[str | None, typer.Option(
    "--platform", metavar="OS/ARCH[,...]|all",
    help="For an image index in a registry (--image HOST/REPO:TAG): linux/amd64, a comma list, or all "
    "(attestation entries are not platforms). Default: the engine's own platform.")]
JunitOpt = Annotated[Path | None, typer.Option("--junit", help="Also write a JUnit XML file here.")]


def platform_request(platform: str | None) -> str | None:
    """The `--platform` value as the pipeline takes it (None: the engine's own platform).

    Checked for form here, so a typo is exit 2 before any work; whether the index has each
    platform is checked against the index itself (registry/platform_select.py `select`)."""
    if platform is None:
        return None
    from ..registry.platform_select import parse_request

    wanted = parse_request(platform)
    return "all" if wanted is None else ",".join(map(str, wanted))


def target_spec(root: Path | None, image: str | None, python: str | None, *, pull: str = "missing",
                tag: str | None = None, force: bool = False, push: bool = False,
                platform: str | None = None) -> TargetSpec:
    if (root is None) == (image is None):
        raise BadInput("give exactly one target: --root DIR (a site-packages folder) or --image REF",
                       hint="see dspark-patch COMMAND --help")
    policy = pull_policy(pull)
    if image is not None:
        if push and not tag:
            raise BadInput("--push needs --tag NAME (the reference to push)")
        return ImageSpec(ref=image, python=python, pull=policy, tag=tag, force=force, push=push,
                         platform=platform_request(platform))
    if platform is not None:
        raise BadInput("--platform is for --image (an image index in a registry) only")
    if tag or force or push:
        raise BadInput("--tag, --force-tag and --push are for --image only")
    return LocalSpec(root=str(root), python=python)


def pull_policy(value: str) -> PullPolicy:
    policies: dict[str, PullPolicy] = {"missing": "missing", "always": "always", "never": "never"}
    if value in policies:
        return policies[value]
    raise BadInput(f"--pull {value!r}: choose missing, always or never")


def check_outputs(report_dir: Path | None, junit: Path | None = None, *files: Path) -> None:
    """Refuse, before any work, a report folder (or the default one) that is or sits under a link,
    or that holds a link under the name of a report file; the same for `junit` and `files`."""
    from .. import ownfiles
    from ..report import render

    if report_dir is None:
        ownfiles.check_folder(DEFAULT_REPORTS)
    else:
        ownfiles.check_names(report_dir, list(render.REPORT_FILES))
    for path in (junit, *files):
        if path is not None:
            ownfiles.check_names(path.parent, [path.name])


def report_folder(report_dir: Path | None, command: str) -> Path:
    """Where the run's report set goes: --report-dir, or ./dspark-patch-reports/COMMAND-TIME."""
    return report_dir or DEFAULT_REPORTS / f"{command}-{datetime.now(UTC).strftime('%Y%m%dT%H%M%SZ')}"


def write_reports(report: AuditReport, folder: Path, junit: Path | None) -> None:
    """The report set (and the --junit file), each whole or not at all."""
    from ..report import render

    render.write_report_dir(report, folder)
    if junit is not None:
        render.write_text_atomic(junit, render.to_junit(report))


def finish(report: AuditReport, *, report_dir: Path | None, as_json: bool, junit: Path | None = None) -> None:
    """Write the report (every run, failed ones too), render it, and exit with its code.

    A report set that cannot be written fails the run (exit 3); an image `apply` whose result was
    already named then takes the name back (pipeline.withdraw), so that no tag outlives a run that
    exits non-zero, and no report set says "applied" for a result that was taken back."""
    from ..report import render, summary

    folder = report_dir or report_folder(None, report.command)
    try:
        write_reports(report, folder, junit)
    except EnvironmentProblem as exc:
        if report.exit_code != 0:
            raise
        from .. import pipeline

        try:
            undone = pipeline.withdraw(report)
        except DsparkPatchError as also:
            undone = f"taking the result back failed too: {also.message}"
        render.remove_report_set(folder)
        if undone:
            raise EnvironmentProblem(f"{exc.message}; {undone}", hint=exc.hint) from None
        raise
    summary.append_step_summary_from_env(report)
    if as_json:
        output.print_json(render.to_json(report))
    else:
        output.summary(report, folder)
    for err in report.errors:
        output.error_line_text(err.message + (f" ({err.hint})" if err.hint else ""))
    raise typer.Exit(report.exit_code)
