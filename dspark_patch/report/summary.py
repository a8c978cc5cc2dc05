"""The CI step summary: GitHub Actions shows the Markdown a step appends to $GITHUB_STEP_SUMMARY.

Appended, never overwritten: other steps of the same job write to the same file.
https://docs.github.com/actions/using-workflows/workflow-commands-for-github-actions#adding-a-job-summary
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from dspark_patch.errors import EnvironmentProblem
from dspark_patch.report.markdown import to_markdown
from dspark_patch.report.model import AuditReport

ENV_VAR = "GITHUB_STEP_SUMMARY"


def append_step_summary(report: AuditReport, path: Path | str) -> Path:
    return append_markdown(to_markdown(report), path)


def append_markdown(markdown: str, path: Path | str) -> Path:
    """Append one Markdown block (an audit's, a status run's) to the summary file at `path`;
    EnvironmentProblem (exit 3) when it cannot be written."""
    path = Path(path)
    try:
        with open(path, "a+b") as fh:
            # Keep what earlier steps wrote as its own block: a blank line between, and never
            # glue our heading onto their last line.
            size = fh.seek(0, os.SEEK_END)
            prefix = b""
            if size:
                fh.seek(size - 1)
                prefix = b"\n" if fh.read(1) == b"\n" else b"\n\n"
            text = markdown.rstrip("\n") + "\n"
            fh.write(prefix + text.encode("utf-8", errors="backslashreplace"))
    except OSError as exc:
        raise EnvironmentProblem(
            f"cannot append the step summary to {path} (${ENV_VAR}): {exc.strerror}",
            hint=f"unset {ENV_VAR} outside CI",
        ) from None
    return path


def append_step_summary_from_env(report: AuditReport, environ: Mapping[str, str] = os.environ) -> Path | None:
    """Append when $GITHUB_STEP_SUMMARY names a file; return it, or None when not in CI."""
    return append_markdown_from_env(to_markdown(report), environ)


def append_markdown_from_env(markdown: str, environ: Mapping[str, str] = os.environ) -> Path | None:
    """Append when $GITHUB_STEP_SUMMARY names a file; return it, or None when not in CI."""
    target = environ.get(ENV_VAR, "").strip()
    return append_markdown(markdown, target) if target else None
