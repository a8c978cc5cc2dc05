"""`dspark-patch reference add` and `reference list`: the published wheels files are checked against."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer

from . import common, output

reference_app = typer.Typer(help="The references of published wheels that installed files are checked against: "
                            "list them, add one for a release the tool ships none for.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(reference_app, name="reference")


@reference_app.command("add")
def add(
    source: Annotated[str, typer.Argument(metavar="WHEEL|NAME==RELEASE", help="A published wheel file, or e.g. vllm==0.34.0 to fetch it with pip (pip download --no-deps; pip checks the index's hash).")],
    platform: Annotated[str | None, typer.Option("--platform", help="With NAME==RELEASE: the wheel platform to fetch (pip's --platform, e.g. manylinux_2_28_aarch64; default this machine's).")] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Make a release's reference from its published wheel (its RECORD checked against the bytes in it) and keep it in
    $DSPARK_PATCH_REFERENCES (default $XDG_DATA_HOME/dspark-patch/references, ~/.local/share/dspark-patch/references),
    where status, verify, apply and publish find it. Exit 0: added (or already there); 1: the wheel differs from the
    shipped reference of the same name; 2: bad input (no such file, not a wheel, a RECORD that lies); 3: pip failed."""
    from ..pipeline.reference_add import AddRequest
    from ..pipeline.reference_add import add as run_add

    is_spec = not source.endswith(".whl") and not os.path.lexists(source)   # else a file, checked as a wheel
    added = run_add(AddRequest(wheel=None if is_spec else source, spec=source if is_spec else None, platform=platform))
    if as_json:
        output.print_json(json.dumps({"outcome": added.outcome, "reference": added.name, "path": added.path,
                                      "wheel": added.wheel, "files": added.files, "fetched": added.fetched}, indent=2))
        return
    said = {"written": "added", "replaced": "replaced", "unchanged": "already there, the same",
            "shipped": "shipped with dspark-patch already, the same; nothing written"}[added.outcome]
    output.print_text(f"{added.name}: {said} ({added.files} files of {added.wheel}{', fetched with pip' if added.fetched else ''})"
                      f"\n  {added.path}")


@reference_app.command("list")
def list_references(as_json: common.JsonOpt = False) -> None:
    """List the references: shipped with dspark-patch, then the user's own, each read and checked as a lookup reads
    it. Exit 2 when a user's file is not one the tool can trust (it is listed, and named on the error line)."""
    from ..pipeline.reference_add import listing

    found = listing()
    if as_json:
        output.print_json(json.dumps({
            "user_folder": found.user_folder,
            "references": [{"reference": r.name, "origin": r.origin, "path": r.path, "wheel": r.wheel, "files": r.files,
                            "error": None if r.error is None else r.error.line()} for r in found.references],
            "shadowed": [{"reference": n, "path": p, "differs": d} for n, p, d in found.shadowed]}, indent=2))
    else:
        lines = [f"{r.name}  {r.origin}  {r.path}" + ("  (not used: it does not load)" if r.error else "")
                 for r in found.references]
        lines += [f"{name}  user, not used: the shipped one of that name wins"
                  f"{' (their contents DIFFER)' if differs else ' (the same bytes)'}  {path}"
                  for name, path, differs in found.shadowed]
        lines.append(f"user references: {found.user_folder} (add one: dspark-patch reference add vllm==RELEASE)")
        output.print_text("\n".join(lines))
    bad = [r.error for r in found.references if r.error is not None]
    if bad:
        raise bad[0]
