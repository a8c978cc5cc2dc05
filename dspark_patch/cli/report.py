"""`dspark-patch report render` and `report merge`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import BadInput
from . import output

report_app = typer.Typer(help="Work with saved reports: render an audit.json, merge status shards.", no_args_is_help=True)
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


MERGE_FORMATS = ("json", "md", "junit")


@report_app.command("merge")
def merge_cmd(
    paths: Annotated[list[Path], typer.Argument(metavar="SHARD_JSON...", help="The status.json of each `status --shard I/N` run.")],
    out: Annotated[Path | None, typer.Option("--output", "-o", help="Write the merged report here (default: stdout).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="json (a status document), md or junit.")] = "json",
    allow_partial: Annotated[bool, typer.Option("--allow-partial", help="Merge even when shards are missing; the report says which, and never exits 0.")] = False,
) -> None:
    """Join the shards of one `status --shard I/N` run into the report the unsharded run gives.

    Exit: the merged report's (0 every image clean, 1 findings or a partial merge, 2 bad input, 3
    the engine); 2 also when the shards do not make one run: overlapping, missing (without
    --allow-partial), from other tool versions, patch sets or image lists, or malformed."""
    from ..report import render
    from ..report.merge import merge
    from ..report.status_render import to_status_json, to_status_junit, to_status_markdown

    if fmt not in MERGE_FORMATS:
        raise BadInput(f"--format {fmt!r} is not one of {', '.join(MERGE_FORMATS)}")
    fleet = merge(paths, allow_partial=allow_partial)
    text = {"json": to_status_json, "md": to_status_markdown, "junit": to_status_junit}[fmt](fleet)
    if out is None:
        output.print_json(text)
    else:
        render.write_text_atomic(out, text)
    raise typer.Exit(fleet.exit_code)
