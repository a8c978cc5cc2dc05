"""`dspark-patch apply`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import pipeline
from ..errors import BadInput
from . import common, output


def register(app: typer.Typer) -> None:
    app.command("apply")(apply)


def apply(
    root: common.RootOpt = None,
    image: common.ImageOpt = None,
    pull: common.PullOpt = "missing",
    patch: common.PatchesOpt = None,
    series: common.SeriesOpt = None,
    strip: common.StripOpt = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Plan and check everything; write nothing.")] = False,
    no_compile: Annotated[bool, typer.Option("--no-compile", help="Do not byte-compile the patched files.")] = False,
    no_probe: common.NoProbeOpt = False,
    python: common.PythonOpt = None,
    platform: common.PlatformOpt = None,
    allow_unknown_base: Annotated[bool, typer.Option("--allow-unknown-base", help="Do not require the known pre-image hashes, nor the rest of the tree to be the published wheel; rely on zero-fuzz placement alone (the report says so).")] = False,
    allow_unreviewed: Annotated[bool, typer.Option("--allow-unreviewed", help="Apply a variant `dspark-patch port` made that no person has marked reviewed yet (the report says so).")] = False,
    strict_layers: Annotated[bool, typer.Option("--strict-layers", help="Read every layer of the source image with the strict layer reader (as status --via layers does) even where the scan cache lacks it, and refuse what it refuses: a save of the whole image. Default: cached layers only.")] = False,
    layer_out: Annotated[Path | None, typer.Option("--layer-out", help="With --root: also write the layer the patched files make (a tar: the files, their bytecode and the folders above them, owner and mode as the tree has them; a deleted file as a whiteout) to this file, for an image built without an engine. Written only when the run applies.")] = None,
    tag: Annotated[str | None, typer.Option("--tag", help="Name the patched image (--image only). For an index: the new index; each platform image is tagged TAG-OS-ARCH[-VARIANT].")] = None,
    force: Annotated[bool, typer.Option("--force-tag", "--force", help="Move an existing --tag to the new image (without it, a tag that exists, or that another run sets meanwhile, fails the run; it is never moved).")] = False,
    push: Annotated[bool, typer.Option("--push", help="Push --tag through the engine after committing. For an index: every platform image, then the new index (only if every platform passed).")] = False,
    sign_key: Annotated[Path | None, typer.Option("--sign-key", help="With --push: sign the in-toto statement with this private key (PEM, PKCS#8, ECDSA P-256 or Ed25519; passphrase from DSPARK_PATCH_SIGN_PASSPHRASE) and attach it to each pushed manifest in the registry.")] = None,
    allow_open_key: Annotated[bool, typer.Option("--allow-open-key", help="Sign with a --sign-key file that group or others may read (refused otherwise, as ssh refuses such a key: see docs/attestations.md).")] = False,
    report_dir: common.ReportDirOpt = None,
    junit: common.JunitOpt = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Apply the patch (or a series, in order) with zero fuzz, byte-compile, probe, and (for an image) commit one new layer."""
    if sign_key is not None and not push:
        raise BadInput("--sign-key attaches the attestation to the pushed image, so it needs --push (and --tag)")
    if sign_key is not None and (series is not None or len(patch or ()) > 1):
        raise BadInput("--sign-key signs the attestation of one patch set; a series cannot be signed yet",
                       hint="apply the series without --sign-key")
    if strict_layers and image is None:
        raise BadInput("--strict-layers reads the layers of an image (--image); a local tree has none")
    if layer_out is not None and (root is None or dry_run):
        raise BadInput("--layer-out writes the layer of a local tree that apply patches: it needs --root and no --dry-run",
                       hint="run apply --root SITE --layer-out FILE inside the image")
    common.check_outputs(report_dir, junit, *(() if layer_out is None else (layer_out,)))
    request = pipeline.ApplyRequest(
        target=common.target_spec(root, image, python, pull=pull, tag=tag, force=force, push=push, platform=platform),
        patches=tuple(patch or ()), series=None if series is None else str(series), strip=strip, dry_run=dry_run, compile=not no_compile, probe=not no_probe,
        allow_unknown_base=allow_unknown_base, allow_unreviewed=allow_unreviewed, strict_layers=strict_layers,
        layer_out=None if layer_out is None else str(layer_out),
        sign_key=str(sign_key) if sign_key else None, allow_open_key=allow_open_key,
    )
    folder = common.report_folder(report_dir, "apply")
    with output.pull_display() as pulls:
        # The report set is written before the result is named (and again, whole, at the end).
        report = pipeline.apply(request, on_step=output.step_printer(not as_json), on_pull=pulls,
                                on_result=lambda draft: common.write_reports(draft, folder, junit))
    common.finish(report, report_dir=folder, as_json=as_json, junit=junit)
