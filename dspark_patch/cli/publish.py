"""`dspark-patch publish`: an in-image run's layer onto its image, registry to registry, no engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from . import common, output


def register(app: typer.Typer) -> None:
    app.command("publish")(publish)


def publish(
    image: Annotated[str, typer.Option("--image", help="The source image in its registry (HOST/REPO:TAG or @sha256:…): the one the in-image run ran in.")],
    layer: Annotated[Path, typer.Option("--layer", help="The layer file `apply --root SITE --layer-out FILE` wrote in that image.")],
    report: Annotated[Path, typer.Option("--report", help="The audit.json the same run wrote.")],
    tag: Annotated[str, typer.Option("--tag", help="Where to publish the patched image: HOST/REPO:TAG.")],
    force: Annotated[bool, typer.Option("--force", help="Move --tag if it exists (without it, a tag that exists, or that another push sets meanwhile, fails the run; it is never moved).")] = False,
    cache_max: Annotated[str | None, typer.Option("--cache-max", help="Bound of the layer-scan cache status uses (e.g. 2G; 0 turns it off).")] = None,
    report_dir: Annotated[Path | None, typer.Option("--report-dir", help="Write the report of the published image here (audit.json, audit.md, junit.xml): the in-image run's, naming the source and the result.")] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Publish the layer an in-image apply wrote onto the image it ran in, with no Docker engine.

    Reads the source from its registry (strict layer reader, status's scan cache); proves the
    report was made from that image's tree (site folder, release, interpreter, every pre-image,
    integrity against the published wheel) and that the layer is exactly the report's (its digest,
    its entries, each post-image, each .pyc's embedded source hash); then uploads the layer and a
    config that keeps the source's, mounts the source's layers, and puts the tag last.

    Exit 0: published; 2: the layer or report does not prove it (another image or release, edited,
    a file more or less), the tag exists, or the source moved meanwhile; 3: a registry refused or
    did not answer. Nothing is tagged unless it exits 0."""
    from ..publish import PublishRequest
    from ..publish import publish as run_publish
    from ..targets.caches.scans import parse_size

    if report_dir is not None:
        common.check_outputs(report_dir)
    request = PublishRequest(source=image, layer=layer, report=report, tag=tag, force=force,
                             cache_max=parse_size(cache_max, "--cache-max") if cache_max is not None else None)
    done = run_publish(request)
    if report_dir is not None:
        common.write_reports(done.report, report_dir, None)
    if as_json:
        from ..serialise import dumps

        output.print_json(dumps({"ref": done.ref, "repo_digest": done.repo_digest, "image_id": done.image_id,
                                   "source_digest": done.source_digest, "layer_blob": done.layer_blob,
                                   "layer_size": done.layer_size, "sent": done.sent,
                                   "bytecode_checked": done.bytecode_checked,
                                   "bytecode_recompiled": done.bytecode_recompiled, "notes": list(done.notes)}))
        return
    sent = done.sent
    output.line(f"OK: published {done.ref} as {done.repo_digest}")
    output.line(f"  sent {sent.bytes} bytes ({sent.uploaded} blob(s)); the source's layers: {sent.mounted} mounted, "
                f"{sent.present} already there" + (f", {sent.copied_bytes} bytes copied from its registry" if sent.copied_bytes else ""))
    for note in done.notes:
        output.line(f"  note: {note}")
