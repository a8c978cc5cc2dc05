"""`dspark-patch publish`: an in-image run's layer onto its image, registry to registry, no engine."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import BadInput
from . import common, output


def register(app: typer.Typer) -> None:
    app.command("publish")(publish)


def publish(
    image: Annotated[str, typer.Option("--image", help="The source image in its registry (HOST/REPO:TAG or @sha256:…): the one the in-image run ran in.")],
    layer: Annotated[list[str], typer.Option("--layer", help="The layer file `apply --root SITE --layer-out FILE` wrote in that image. For an index: PLATFORM=FILE, once per platform (every platform of the index).")],
    report: Annotated[list[str], typer.Option("--report", help="The audit.json the same run wrote (for an index: PLATFORM=FILE, as --layer).")],
    tag: Annotated[str, typer.Option("--tag", help="Where to publish the patched image: HOST/REPO:TAG.")],
    force: Annotated[bool, typer.Option("--force", help="Move --tag if it exists (without it, a tag that exists, or that another push sets meanwhile, fails the run; it is never moved).")] = False,
    sign_key: Annotated[Path | None, typer.Option("--sign-key", help="Sign the in-toto statement of the published image (an index: and each platform's) with this private key and attach it as a referrer, as `apply --push --sign-key` does (see docs/attestations.md).")] = None,
    allow_open_key: Annotated[bool, typer.Option("--allow-open-key", help="Sign with a --sign-key file that group or others may read.")] = False,
    python: Annotated[str | None, typer.Option("--python", help="An interpreter of the image's Python minor (e.g. python3.13) to recompile the layer's bytecode with, where this host's is another and none is on PATH.")] = None,
    allow_unreviewed: Annotated[bool, typer.Option("--allow-unreviewed", help="Publish a patch set whose variant is unreviewed in the patch sets this publisher loads (made by `port`, not yet marked reviewed), as `apply --allow-unreviewed` applies one; the published report says unreviewed, whatever the in-image report says.")] = False,
    cache_max: Annotated[str | None, typer.Option("--cache-max", help="Bound of the layer-scan cache status uses (e.g. 2G; 0 turns it off).")] = None,
    report_dir: Annotated[Path | None, typer.Option("--report-dir", help="Write the report of the published image here (audit.json, audit.md, junit.xml): the in-image run's, naming the source and the result.")] = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Publish the layer an in-image apply wrote onto the image it ran in, with no Docker engine.

    Reads the source from its registry (strict layer reader, status's scan cache); proves the
    report was made from that image's tree (site folder, release, interpreter, every pre-image,
    integrity against the published wheel) and that the layer is exactly the report's (its digest,
    its entries, each post-image, each header as apply --image writes it, each .pyc recompiled by
    the image's Python minor); then uploads the layer and a
    config that keeps the source's, mounts the source's layers, and puts the tag last. An index
    takes one run per platform (--layer/--report PLATFORM=FILE each) and is published whole.
    What it cannot prove it does not take from the report: each patch set's review state is the
    one this publisher loads (unreviewed needs --allow-unreviewed), and the probe's result is
    carried as claimed by the in-image job, not verified by the publisher.

    Exit 0: published; 2: the layer or report does not prove it (another image or release, edited,
    a file more or less), an unreviewed patch set without --allow-unreviewed, the tag exists, or
    the source moved meanwhile; 3: a registry refused or
    did not answer. Nothing is tagged unless every proof holds and every upload succeeded; only an
    attestation that cannot be attached after the tag (--sign-key) leaves the tag with a non-zero
    exit, as `apply --push --sign-key` does."""
    from ..publish import PublishRequest
    from ..publish import publish as run_publish
    from ..targets.caches.scans import parse_size

    if report_dir is not None:
        common.check_outputs(report_dir)
    request = PublishRequest(source=image, pairs=_pairs(layer, report), tag=tag, force=force,
                             sign_key=None if sign_key is None else str(sign_key), allow_open_key=allow_open_key,
                             python=python,
                             allow_unreviewed=allow_unreviewed,
                             cache_max=parse_size(cache_max, "--cache-max") if cache_max is not None else None)
    done = run_publish(request)
    if report_dir is not None:
        common.write_reports(done.report, report_dir, None)
    if not done.report.ok:   # published and tagged; the attestation was not (fully) attached
        for err in done.report.errors:
            output.error_line_text(err.message + (f" ({err.hint})" if err.hint else ""))
        raise typer.Exit(done.report.exit_code)
    if as_json:
        from ..serialise import dumps

        output.print_json(dumps({"ref": done.ref, "repo_digest": done.repo_digest, "image_id": done.image_id,
                                   "source_digest": done.source_digest, "layer_blob": done.layer_blob,
                                   "layer_size": done.layer_size, "sent": done.sent,
                                   "bytecode_checked": done.bytecode_checked,
                                   "bytecode_recompiled": done.bytecode_recompiled, "platforms": list(done.platforms),
                                   "notes": list(done.notes)}))
        return
    sent = done.sent
    output.line(f"OK: published {done.ref} as {done.repo_digest}"
                + (f" (an index of {', '.join(done.platforms)})" if done.platforms else ""))
    output.line(f"  sent {sent.bytes} bytes ({sent.uploaded} blob(s)); the source's layers: {sent.mounted} mounted, "
                f"{sent.present} already there" + (f", {sent.copied_bytes} bytes copied from its registry" if sent.copied_bytes else ""))
    for note in done.notes:
        output.line(f"  note: {note}")


def _split(value: str) -> tuple[str | None, Path]:
    """FILE, or PLATFORM=FILE (OS/ARCH[/VARIANT], as `docker --platform` takes it)."""
    from ..registry.platform_select import Platform

    head, sep, tail = value.partition("=")
    if sep:
        try:
            Platform.parse(head)
        except BadInput:
            return None, Path(value)   # a file name with '=' in it
        return head, Path(tail)
    return None, Path(value)


def _pairs(layers: list[str], reports: list[str]):
    """--layer and --report paired: by platform (an index), or the one of each."""
    from ..publish import LayerPair

    split_layers = [_split(v) for v in layers]
    split_reports = [_split(v) for v in reports]
    if len(layers) != len(reports):
        raise BadInput(f"{len(layers)} --layer and {len(reports)} --report: each in-image run gives one of each",
                       hint="give --layer and --report once per run (PLATFORM=FILE for each platform of an index)")
    if len(layers) == 1 and split_layers[0][0] is None and split_reports[0][0] is None:
        return (LayerPair(platform=None, layer=split_layers[0][1], report=split_reports[0][1]),)
    by_platform = {}
    for platform, path in split_reports:
        if platform is None or platform in by_platform:
            raise BadInput(f"--report: {'each needs its PLATFORM=' if platform is None else platform + ' given twice'}",
                           hint="write --layer PLATFORM=FILE --report PLATFORM=FILE once per platform")
        by_platform[platform] = path
    pairs = []
    for platform, path in split_layers:
        if platform is None or platform not in by_platform:
            raise BadInput(f"--layer {platform or path}: no --report for {'it' if platform is None else platform}",
                           hint="write --layer PLATFORM=FILE --report PLATFORM=FILE once per platform")
        pairs.append(LayerPair(platform=platform, layer=path, report=by_platform.pop(platform)))
    if by_platform:
        raise BadInput(f"--report {next(iter(by_platform))}=…: no --layer for it",
                       hint="write --layer PLATFORM=FILE --report PLATFORM=FILE once per platform")
    return tuple(pairs)
