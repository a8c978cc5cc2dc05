"""`dspark-patch list`, `show ID` and `gc`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from .. import patchset as patchsets
from . import common, output


def register(app: typer.Typer) -> None:
    app.command("list")(list_patch_sets)
    app.command("show")(show)
    app.command("new")(new)
    app.command("gc")(gc)


def list_patch_sets(as_json: common.JsonOpt = False) -> None:
    """List the known patch sets (shipped, then DSPARK_PATCH_PATH's) and the releases each covers."""
    sets = patchsets.available()
    if as_json:
        output.print_json(json.dumps([_summary(p) for p in sets], indent=2))
        return
    for p in sets:
        releases = ", ".join(r for v in p.variants for r in v.releases)
        output.print_text(f"{p.id}  {p.title}  [{p.distribution} {releases}]")


def show(patch_id: Annotated[str, typer.Argument(metavar="ID", help="A patch-set id or folder.")], as_json: common.JsonOpt = False) -> None:
    """Show a patch set: summary, variants, files and their known hashes."""
    p = patchsets.resolve(patch_id)
    if as_json:
        output.print_json(json.dumps(_summary(p), indent=2))
        return
    lines = [f"{p.id or p.title}: {p.title}", "", p.summary, "", f"distribution: {p.distribution}   strip: {p.strip}   probe: {p.probe.name if p.probe else 'none'}"]
    for v in p.variants:
        origin = f"; ported from {v.ported_from}" if v.ported_from else ""
        lines.append(f"variant {v.name}: releases {', '.join(v.releases) or '-'}; diff {v.diff_path.name} sha256 {v.diff_sha256}; "
                     f"{v.review}{origin}")
        for path, h in v.files.items():
            lines.append(f"  {path}\n    pre  {h.pre_sha256 or '(added)'}\n    post {h.post_sha256 or '(deleted)'}")
    output.print_text("\n".join(lines))


def new(
    patch_id: Annotated[str, typer.Argument(metavar="ID", help="The new patch set's id (and folder name).")],
    wheel: Annotated[Path | None, typer.Option("--wheel", help="The published wheel of the tree's release, diffed against (default: pip download --no-deps vllm==RELEASE of the tree's release and platform, into a temporary folder).")] = None,
    root: Annotated[Path | None, typer.Option("--root", help="The edited site-packages folder that holds vllm.")] = None,
    image: Annotated[str | None, typer.Option("--image", help="Or: an image someone edited in a container and committed (read without running it).")] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Where to write ID/ (default: the first folder of DSPARK_PATCH_PATH, else the current folder).")] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Make a patch set from an edited installed tree (--root) or image (--image): its diff against the published wheel, known patch sets already applied there recorded as `requires`, review = "unreviewed"."""
    from ..pipeline.new_set import NewRequest, make

    made = make(NewRequest(id=patch_id, wheel=None if wheel is None else str(wheel), root=None if root is None else str(root), image=image,
                           out=None if out is None else str(out)))
    if as_json:
        output.print_json(json.dumps({"folder": str(made.folder), "release": made.release, "requires": list(made.requires),
                                      "files": [{"path": p, "action": a} for p, a in made.files],
                                      "notes": list(made.notes)}, indent=2))
        return
    lines = [f"wrote {made.folder} (vllm {made.release}, unreviewed)"]
    if made.requires:
        lines.append(f"requires {', '.join(made.requires)} (already applied in the tree)")
    lines += [f"  {action:6} {path}" for path, action in made.files]
    lines += [f"note: {note}" for note in made.notes]
    lines.append("read its diff, describe it in patch.toml, then set review = \"reviewed\"")
    output.print_text("\n".join(lines))


def gc() -> None:
    """Remove containers left behind by a killed dspark-patch run."""
    from ..targets.docker import gc_containers

    removed = gc_containers()
    output.print_text(f"removed {len(removed)} leftover container(s)" + "".join(f"\n  {c}" for c in removed))


def _summary(p: patchsets.PatchSet) -> dict:
    return {
        "id": p.id, "title": p.title, "summary": p.summary, "distribution": p.distribution,
        "strip": p.strip, "probe": p.probe.name if p.probe else None,
        "variants": [{"name": v.name, "releases": list(v.releases), "diff": v.diff_path.name,
                      "sha256": v.diff_sha256, "review": v.review, "ported_from": v.ported_from,
                      "files": {k: {"pre_sha256": h.pre_sha256, "post_sha256": h.post_sha256} for k, h in v.files.items()}}
                     for v in p.variants],
    }
