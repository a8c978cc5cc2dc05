"""`dspark-patch verify` and `dspark-patch probe`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .. import pipeline, routing
from ..errors import BadInput, DsparkPatchError
from . import common, output


def register(app: typer.Typer) -> None:
    app.command("verify")(verify)
    app.command("probe")(probe)


def verify(
    root: common.RootOpt = None,
    image: common.ImageOpt = None,
    pull: common.PullOpt = "missing",
    patch: common.PatchesOpt = None,
    series: common.SeriesOpt = None,
    strip: common.StripOpt = None,
    python: common.PythonOpt = None,
    platform: common.PlatformOpt = None,
    no_probe: common.NoProbeOpt = False,
    attestation: Annotated[bool, typer.Option("--attestation", help="Check the signed attestation attached to the image in its registry instead (needs --key): signature, subject digest, statement, predicate. Reads manifests and the envelope only; pulls no layer. For an index: the index and every platform (or --platform).")] = False,
    key: Annotated[Path | None, typer.Option("--key", help="With --attestation: the public key (PEM) the attestation must be signed with.")] = None,
    require_proven_probe: Annotated[bool, typer.Option("--require-proven-probe", help="With --attestation: hold only a probe the signing run ran itself (`apply --image`); a probe result `publish` carried as claimed by the in-image job, not verified by the publisher, does not hold.")] = False,
    via: Annotated[str, typer.Option("--via", help="How --image is read: auto (default: the engine; the registry when no engine answers and the image names its registry), engine, or registry (no engine: the image's layers straight from its registry, as `status --via registry` reads them; the probe does not run, and the patched modules' bytecode is recompiled by an interpreter of the image's Python minor: this host's, --python PATH (here a path on this host), or python3.X on PATH; with none, the run fails, exit 3).")] = "auto",
    cache_max: Annotated[str | None, typer.Option("--cache-max", help="With --via registry: bound of the layer-scan cache status uses (e.g. 2G; 0 turns it off).")] = None,
    report_dir: common.ReportDirOpt = None,
    junit: common.JunitOpt = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Prove a tree or image carries exactly the patch: post-images, bytecode, RECORD, labels, probe."""
    common.check_outputs(report_dir, junit)
    if require_proven_probe and not attestation:
        raise BadInput("--require-proven-probe holds a signed attestation's probe to what its signer saw; it goes "
                       "with --attestation", hint="add --attestation --key PUB.pem")
    if attestation or key is not None:
        if not attestation or key is None:
            raise BadInput("--attestation and --key go together: check the attestation signed by that public key")
        if image is None or root is not None:
            raise BadInput("--attestation checks an image in a registry: give --image HOST[:PORT]/REPO:TAG, not --root")
        checked = pipeline.verify_attestation(pipeline.AttestationRequest(
            ref=image, key=str(key), patch=_one_patch(patch, series), platform=common.platform_request(platform),
            require_proven_probe=require_proven_probe),
            on_step=output.step_printer(not as_json))
        common.finish(checked, report_dir=report_dir, as_json=as_json, junit=junit)
    route, no_engine = routing.verify_route(via, image=image, root=root, python=python, platform=platform, pull=pull,
                                            strip=strip, no_engine=_no_engine)
    if route is not None:
        from ..publish.registry_verify import RegistryVerifyRequest, verify_registry
        from ..targets.caches.scans import parse_size

        assert image is not None
        checked = verify_registry(RegistryVerifyRequest(
            ref=image, patches=tuple(patch or ()), series_file=None if series is None else str(series),
            cache_max=parse_size(cache_max, "--cache-max") if cache_max is not None else None, no_engine=no_engine,
            python=python, route=route),
            on_step=output.step_printer(not as_json))
        common.finish(checked, report_dir=report_dir, as_json=as_json, junit=junit)
    request = pipeline.VerifyRequest(target=common.target_spec(root, image, python, pull=pull, platform=platform),
                                     patches=tuple(patch or ()), series=None if series is None else str(series),
                                     strip=strip, probe=not no_probe)
    with output.pull_display() as pulls:
        report = pipeline.verify(request, on_step=output.step_printer(not as_json), on_pull=pulls)
    common.finish(report, report_dir=report_dir, as_json=as_json, junit=junit)


def _no_engine() -> DsparkPatchError | None:
    """The engine's error when no engine answers (verify --via auto then reads the registry)."""
    from ..errors import EngineUnreachable
    from ..targets import open_store

    try:
        open_store()
    except EngineUnreachable as exc:
        return exc
    return None


def _one_patch(patches: list[str] | None, series: Path | None) -> str | None:
    """--attestation checks one patch set's attestation."""
    if series is not None or len(patches or ()) > 1:
        raise BadInput("--attestation checks the attestation of one patch set; a series has none yet",
                       hint="give --patch once, or verify the series without --attestation")
    return patches[0] if patches else None


def probe(
    root: common.RootOpt = None,
    image: common.ImageOpt = None,
    pull: common.PullOpt = "missing",
    patch: common.PatchOpt = None,
    python: common.PythonOpt = None,
    platform: common.PlatformOpt = None,
    report_dir: common.ReportDirOpt = None,
    as_json: common.JsonOpt = False,
) -> None:
    """Run the patch set's own CPU probe with the target's interpreter (exit 0 pass, 1 fail)."""
    common.check_outputs(report_dir)
    request = pipeline.ProbeRequest(target=common.target_spec(root, image, python, pull=pull, platform=platform), patch=patch)
    with output.pull_display() as pulls:
        report = pipeline.probe(request, on_step=output.step_printer(not as_json), on_pull=pulls)
    common.finish(report, report_dir=report_dir, as_json=as_json)
