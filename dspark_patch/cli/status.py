"""`dspark-patch status`: which images carry which patch sets, which are changed by hand."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from ..errors import BadInput
from . import common, output

if TYPE_CHECKING:
    from ..report.status_model import FleetStatus, ImageStatus

_STATE_STYLE = {"applied": "green", "absent": "dim", "partial": "red", "drifted": "red", "not-applicable": "dim", "upstream": "cyan", "superseded": "cyan"}


def register(app: typer.Typer) -> None:
    app.command("status")(status)


def status(
    image: Annotated[list[str] | None, typer.Option("--image", help="An image reference; repeat for many.")] = None,
    images_from: Annotated[Path | None, typer.Option("--images-from", help="A file with one image reference per line (# comments).")] = None,
    root: Annotated[list[Path] | None, typer.Option("--root", help="A local site-packages folder; repeat for many.")] = None,
    platform: Annotated[str | None, typer.Option("--platform", help="os/arch passed to the engine when it makes the (never started) container; with --via registry, the platforms of an index to read (a comma list; default all).")] = None,
    pull: Annotated[str, typer.Option("--pull", help="never (default: read only what the engine has), missing, always.")] = "never",
    jobs: Annotated[int, typer.Option("--jobs", min=1, max=64, help="Images read at once (--via container, --via registry).")] = 4,
    registry_connections: Annotated[int | None, typer.Option("--registry-connections", min=1, max=64, help="With --via registry: connections open to one registry at once, shared by all the images read (manifests and configs are read side by side). Default: DSPARK_PATCH_REGISTRY_CONNECTIONS, else 8.")] = None,
    via: Annotated[str, typer.Option("--via", help="auto (default: container for one image, layers for several; registry when no engine answers or an image is only in its registry), layers (one save of all images' layers: a layer shared by many is read once), container (a never-started container per image, read through the archive API) or registry (manifests and layers straight from the registry, no engine; every platform of an index unless --platform).")] = "auto",
    cache_max: Annotated[str | None, typer.Option("--cache-max", help="Bound of the layer-scan cache ($DSPARK_PATCH_CACHE/scans, default ~/.cache/dspark-patch/scans), e.g. 500M or 2G; 0 turns it off. Default: DSPARK_PATCH_CACHE_MAX, else 1G.")] = None,
    as_json: common.JsonOpt = False,
    report_dir: Annotated[Path | None, typer.Option("--report-dir", help="Write status.json, status.md and junit.xml here.")] = None,
    junit: common.JunitOpt = None,
    shard: Annotated[str | None, typer.Option("--shard", metavar="I/N", help="Read only share I (0-based) of N of the de-duplicated targets, sorted and cut into N runs of near-equal size; auto/N takes I from $JOB_COMPLETION_INDEX. Join the shards' status.json with dspark-patch report merge.")] = None,
    key: Annotated[Path | None, typer.Option("--key", help="A public key (PEM): also show, per applied patch set, whether a valid attestation signed with it is attached to the image in its registry (attested: yes/no/invalid; invalid is a finding).")] = None,
) -> None:
    """Read-only audit of many images: vLLM release, each patch set's state, files changed or added by hand.

    Exit 0: every image read and clean; 1: an image has unexplained, missing or added files (against
    the published wheel), RECORD rows or bytecode that disagree, no reference for its release, a
    drifted or partial patch set, or no vLLM; 2: bad input (a missing image, a malformed RECORD);
    3: the engine or a registry (unreachable, refused, a blob that is not its digest)."""
    # The fleet's readers (layers, registry, engine) load when status runs, not at each start.
    from ..status.fleet import StatusRequest, read_refs_file
    from ..status.fleet import status as run_status
    from ..status.shard import parse_shard

    if via not in ("auto", "layers", "container", "registry"):
        raise BadInput(f"--via {via!r}: choose auto, layers, container or registry")
    if via == "layers" and platform is not None:
        raise BadInput("--platform is passed to the container the engine creates; it needs --via container (or auto)")
    if pull not in ("never", "missing", "always"):
        raise BadInput(f"--pull {pull!r}: choose never, missing or always")
    refs = tuple(image or ())
    if images_from is not None:
        refs += read_refs_file(images_from)
    roots = tuple(str(r) for r in root or ())
    if not refs and not roots:
        raise BadInput("give at least one --image REF, --images-from FILE or --root DIR", hint="see dspark-patch status --help")
    if via == "registry" and pull != "never":
        raise BadInput("--pull asks the engine to pull; --via registry reads the registry without one",
                       hint="leave --pull out")
    from ..targets.caches.scans import parse_size

    request = StatusRequest(images=refs, roots=roots, platform=platform, pull=pull, jobs=jobs, via=via,  # type: ignore[arg-type]
                            key=str(key) if key else None, shard=parse_shard(shard) if shard is not None else None,
                            cache_max=parse_size(cache_max, "--cache-max") if cache_max is not None else None,
                            connections=registry_connections)
    fleet = run_status(request, on_progress=_progress(not as_json))
    _write(fleet, report_dir, junit)
    if as_json:
        from ..report.status_render import to_status_json

        output.print_json(to_status_json(fleet))
    else:
        _table(fleet)
    raise typer.Exit(fleet.exit_code)


def _progress(enabled: bool):
    """One line per image: on a terminal when it finishes (with its verdict), in CI also when it starts."""
    if not enabled:
        return None
    lock = threading.Lock()
    terminal = output.stderr_is_terminal()

    def show(ref: str, event: str, row: ImageStatus | None) -> None:
        with lock:
            if event == "start":
                if not terminal:
                    output.line(f"status: reading {ref}", err=True, flush=True)
                return
            assert row is not None
            from ..report.status_render import verdict

            word = verdict(row)
            if terminal:
                colour = {"clean": "green", "changed": "red", "not covered": "yellow", "not read": "yellow"}[word]
                output.show_err(f"[{colour}]{word:>8}[/] {ref}")
            else:
                output.line(f"status: {ref}: {word}", err=True, flush=True)

    return show


def _table(fleet: FleetStatus) -> None:
    ids = fleet.patch_set_ids
    share = f" (shard {fleet.shard.index}/{fleet.shard.count} of {fleet.shard.targets})" if fleet.shard else ""
    table = Table(title=f"dspark-patch status: {len(fleet.images)} image(s){share} in {fleet.seconds:.1f}s", title_justify="left")
    keyed = any(i.attested for i in fleet.images)
    for column in ("image", "vLLM", "python", *ids, "unexplained", "missing", "added", *(["attested"] if keyed else []),
                   "route"):
        table.add_column(column, overflow="fold")
    for image in fleet.images:
        if image.error:
            table.add_row(image.ref, "[yellow]not read[/]", *([""] * (len(ids) + 4 + keyed)),
                          image.route.name if image.route else "")
            continue
        states = dict(image.patch_sets)
        table.add_row(
            image.ref, (image.release or "") + (" [yellow](no reference)[/]" if image.reference is None else ""),
            image.python or "",
            *(f"[{_STATE_STYLE[states[i]]}]{states[i]}[/]" if i in states else "" for i in ids),
            *(f"[red]{len(x)}[/]" if x else "0" for x in (image.unexplained, image.missing, image.added)),
            *([", ".join(f"{pid}: {s}" for pid, s in image.attested) or "–"] if keyed else []),
            image.route.name if image.route else "",
        )
    output.show_wide(table)
    for image in fleet.images:
        if image.error:
            output.show_wide(f"{image.ref}: not read: {image.error}", markup=False)
        for label, paths in (("unexplained", image.unexplained), ("missing", image.missing), ("added", image.added),
                             ("vLLM no interpreter imports (not read)", image.unimported),
                             ("RECORD disagrees with the wheel", image.record_disagrees), ("bytecode", image.bytecode),
                             ("not in an installer's shape", image.installer_findings)):
            for path in paths:
                output.show_wide(f"{image.ref}: {label}: {path}", markup=False)
        for line in image.unverified:
            output.show_wide(f"{image.ref}: {line}", markup=False)
        for detail in image.attested_detail:
            output.show_wide(f"{image.ref}: attestation: {detail}", markup=False)
    from ..report.status_render import route_reasons

    for name, reason, count in route_reasons(fleet):
        output.show_wide(f"route {name} ({count} row(s)): {reason}", markup=False)
    for note in fleet.notes:
        output.show_wide(f"note: {note}", markup=False)


def _write(fleet: FleetStatus, report_dir: Path | None, junit: Path | None) -> None:
    from ..report import render, summary
    from ..report.status_render import to_status_json, to_status_junit, to_status_markdown

    if report_dir is not None:
        render.write_text_atomic(report_dir / "status.json", to_status_json(fleet))
        render.write_text_atomic(report_dir / "status.md", to_status_markdown(fleet))
        render.write_text_atomic(report_dir / "junit.xml", to_status_junit(fleet))
    if junit is not None:
        render.write_text_atomic(junit, to_status_junit(fleet))
    summary.append_markdown_from_env(to_status_markdown(fleet))
