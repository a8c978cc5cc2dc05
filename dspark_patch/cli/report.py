"""`dspark-patch report render`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import BadInput
from . import output

report_app = typer.Typer(help="Work with saved audit reports.", no_args_is_help=True)
FORMATS = ("md", "junit", "intoto", "json")


def register(app: typer.Typer) -> None:
    app.add_typer(report_app, name="report")


@report_app.command("render")
def render_cmd(
    path: Annotated[Path, typer.Argument(metavar="AUDIT_JSON", help="A saved audit.json.")],
    fmt: Annotated[str, typer.Option("--format", help="md, junit, intoto or json.")] = "md",
) -> None:
    """Re-render a saved audit.json as Markdown, JUnit XML, an in-toto statement, or JSON."""
    from ..report import render

    if fmt not in FORMATS:
        raise BadInput(f"--format {fmt!r} is not one of {', '.join(FORMATS)}")
    output.print_json(render.render_as(render.read_report(path), fmt))  # type: ignore[arg-type]
