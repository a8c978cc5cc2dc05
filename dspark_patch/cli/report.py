"""`dspark-patch report render`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

import typer

from ..errors import BadInput
from . import output

report_app = typer.Typer(help="Work with saved audit reports.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(report_app, name="report")


@report_app.command("render")
def render_cmd(
    path: Annotated[Path, typer.Argument(metavar="AUDIT_JSON", help="A saved audit.json.")],
    fmt: Annotated[str, typer.Option("--format", help="md, junit, intoto or json.")] = "md",
) -> None:
    """Re-render a saved audit.json as Markdown, JUnit XML, an in-toto statement, or JSON."""
    from ..report import render

    if fmt not in ("md", "junit", "intoto", "json"):
        raise BadInput(f"--format {fmt!r} is not one of md, junit, intoto, json")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise BadInput(f"{path}: no such file", hint="give the audit.json a run wrote") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadInput(f"{path}: not JSON ({exc})", hint="give the audit.json a run wrote") from None
    report = render.from_json_dict(doc)
    if fmt == "md":
        output.print_text(render.to_markdown(report))
    elif fmt == "junit":
        output.print_json(render.to_junit(report))
    elif fmt == "json":
        output.print_json(render.to_json(report))
    else:
        if report.result_image is None:
            raise BadInput(f"{path}: the report has no result image, so an attestation has no subject",
                           hint="attest reports of `apply --image` runs")
        statement = render.to_intoto(report, subject_name=report.result_image.ref,
                                     subject_digest=report.result_image.id)
        output.print_json(json.dumps(statement, indent=2))
