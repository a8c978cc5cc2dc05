"""The registry route of `verify` (`--via registry`, or `--via auto` with no engine): the
engine-free verify of an image in its registry.

The image is read as `status --via registry` reads it (the strict layer reader, status's scan
cache, the site folder found from the image's config without running anything), then held to
what `verify --image` holds it to, as far as nothing can be run:
- each patched file is the final post-image of the patch set or series (named, or the one the
  image's labels name when it names known patch sets; else the shipped default);
- every other file of vLLM is the published wheel's (status's row: nothing unexplained, missing
  or added, RECORD, installer metadata, no other copy of vLLM), and no other known patch set is
  applied beside the series;
- the cached bytecode matches its source: the patched modules' bytecode is recompiled here when
  this host's Python is the image's, else checked by its embedded source hash (said in a note);
- the labels name exactly the series and its files' post-images;
- the top layer holds nothing but what a layer of ours for those files holds.
The probe needs the image's interpreter, so it does not run (said as a skipped step); `verify
--image` runs it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Literal

from .. import unread_env
from ..errors import BadInput, DsparkPatchError, EnvironmentProblem, TargetNotFound, VerifyMismatch
from ..imageref import ImageRef
from ..patchset import PatchSet, Variant, available, known, patched_paths
from ..pipeline.image_steps import label_ids
from ..pipeline.our_layer import OurLayer, top_layer_problems
from ..pipeline.runlog import RunLog, StepCallback
from ..registry.blobs import parse_image_manifest
from ..registry.index import Registry, RegistryUnreachable
from ..registry.manifest import ImageIndex, Manifest, parse_index
from ..report.checks import record_checks
from ..report.labels import LABEL_PREFIX, SERIES_LABEL
from ..report.model import (
    AuditReport,
    DistributionInfo,
    FileReport,
    ImageRecord,
    IndexReport,
    IntegrityReport,
    PlatformReport,
    TargetReport,
)
from ..report.status_model import ImageStatus
from ..routing import Route, asked_registry
from ..series import load
from ..status.assess import assess
from ..status.bytecode import cache_tag, interpreter_for, minor_magic
from ..status.fleet import DISTRIBUTION, row_of
from ..status.registry_route import LayerReader
from ..targets.base import Distribution
from ..targets.views.from_layers import find_site, merge_scans, status_retain
from ..targets.views.site_files import SiteFiles
from .claim import reviewed_files


@dataclass(frozen=True, kw_only=True)
class RegistryVerifyRequest:
    ref: str                          # HOST/REPO:TAG or @digest: one image, or an index (each platform)
    patches: tuple[str, ...] = ()     # patch sets (ids, folders) in series order; () the labels' (or the default)
    series_file: str | None = None    # --series: a file naming them, one a line
    cache_max: int | None = None      # the scan cache's bound
    python: str | None = None         # an interpreter of the image's minor (--python), to recompile its bytecode
    # `--via auto` with no engine answering: the engine's error. The run then says it read the
    # registry instead, and an image the registry does not have (or a registry that does not
    # answer) is that error, with the registry's reason: the engine was what the user asked for.
    no_engine: DsparkPatchError | None = None
    route: Route = field(default_factory=asked_registry)   # why the registry reads it (routing.verify_route)


def verify_registry(request: RegistryVerifyRequest, *, on_step: StepCallback | None = None) -> AuditReport:
    """One image, or every platform image of an index (each verified as one image; the run
    passes only when each does)."""
    from .run import scan_cache_for

    run = RunLog.start("verify", TargetReport(kind="image", ref=request.ref), on_step, route=request.route)
    try:
        ref = ImageRef.parse(request.ref)
        if ref.registry is None:
            raise BadInput(f"--via registry reads {request.ref} from its registry, and it names none",
                           hint="write --image HOST[:PORT]/REPOSITORY:TAG")
        patchsets = known(available())
        reader = LayerReader(retain=status_retain(DISTRIBUTION, patched_paths(patchsets)),
                             cache=scan_cache_for(patchsets, request.cache_max))
        with run.step("resolve"):
            registry, manifest = _fetch(reader, ref.registry, request)
        if request.no_engine is not None:
            run.notes.append("no engine answered at $DOCKER_HOST: the image was read from its registry (--via auto)")
        if not manifest.is_index:
            return record_checks(_verify(request, run, reader, registry, manifest, request.ref, patchsets))
        return record_checks(_verify_index(request, run, reader, registry, parse_index(manifest), ref, patchsets))
    except DsparkPatchError as exc:
        return record_checks(run.report("failed", exc))


def _fetch(reader: LayerReader, host: str, request: RegistryVerifyRequest) -> tuple[Registry, Manifest]:
    try:
        registry = reader.registry(host)
        return registry, registry.fetch(request.ref)
    except (RegistryUnreachable, TargetNotFound) as exc:
        engine = request.no_engine
        if engine is None:
            raise
        raise type(engine)(f"{engine.message}; nor could the registry be read instead: {exc.message}",
                           hint=engine.hint) from None


def _verify_index(request: RegistryVerifyRequest, run: RunLog, reader: LayerReader, registry: Registry,
                  index: ImageIndex, ref: ImageRef, patchsets: list[PatchSet]) -> AuditReport:
    platforms = []
    for platform in index.platforms:
        with run.step(f"platform {platform}"):
            manifest = registry.fetch_platform(index, platform)
            digest_ref = f"{ref.name}@{manifest.digest}"
            one = RunLog.start("verify", TargetReport(kind="image", ref=digest_ref), None, route=request.route)
            try:
                report = record_checks(_verify(request, one, reader, registry, manifest, digest_ref, patchsets))
            except DsparkPatchError as exc:
                report = record_checks(one.report("failed", exc))
        platforms.append(PlatformReport(platform=str(platform), source_manifest=manifest.digest, emulated=False,
                                        report=report))
    run.update(index=IndexReport(ref=request.ref, media_type=index.manifest.media_type, digest=index.manifest.digest,
                                 platforms=tuple(str(p) for p in index.platforms)), platforms=tuple(platforms))
    failed = [p for p in platforms if p.report.status != "verified"]
    if failed:
        first = failed[0].report.errors[0] if failed[0].report.errors else None
        more = f" (and {len(failed) - 1} more platform(s))" if len(failed) > 1 else ""
        # a platform that does not carry the series is the verdict; else the first one's exit
        # (a host with no interpreter to prove a platform's bytecode is exit 3, not a mismatch)
        kind: type[DsparkPatchError] = VerifyMismatch
        if first is not None and not any(p.report.exit_code == 1 for p in failed):
            kind = {2: BadInput, 3: EnvironmentProblem}.get(first.exit_code, VerifyMismatch)
        raise kind(f"{failed[0].platform}: {first.message if first else 'not verified'}{more}",
                   hint=first.hint if first and first.hint else "see the report of each platform")
    return run.report("verified")


def _verify(request: RegistryVerifyRequest, run: RunLog, reader: LayerReader, registry: Registry,
            manifest: Manifest, where: str, patchsets: list[PatchSet]) -> AuditReport:
    """One platform's image: `where` names it (the reference given, or NAME@DIGEST in an index)."""
    ref = ImageRef.parse(where)
    with run.step("config"):
        config = reader.config(registry, where, manifest)
    with run.step("layers"):
        scans = reader.scans(registry, where, manifest, config)
        site = find_site(merge_scans(scans, where=f"image {where}"), DISTRIBUTION, config.config, where)
    run.update(target=TargetReport(kind="image", ref=where, python=None, python_version=site.python,
                                   distribution=DistributionInfo(name=site.distribution, version=site.release,
                                                                 location=site.location),
                                   image=ImageRecord(ref=where, id=config.digest,
                                                     repo_digest=f"{ref.name}@{manifest.digest}")))
    run.notes.extend(unread_env.notes(unread_env.settings(config.config), patchsets, site.retained.get,
                                      distribution=site.distribution, release=site.release))
    labels = {str(k): str(v) for k, v in ((config.config.get("Labels") or {}).items())}
    series = _series(request, labels, run, patchsets)
    # A set the release ships in its own form carries nothing: status's row must say `superseded`
    # (the record's files as proven); its effect cases need the image's python (verify --image).
    superseded = [p for p in series if p.superseded_for(site.release) is not None]
    series = [p for p in series if p not in superseded]
    variants = [(p, p.variant_for(site.release)) for p in series]
    files = reviewed_files(variants)   # each file's pre-image before the series, post-image after it
    final = {path: post for path, (_, post) in files.items()}
    ids = [str(p.id) for p in series]
    problems: list[str] = []

    with run.step("patched files"):
        for path, (pre, post) in files.items():
            found = site.hashes.get(path)
            action: Literal["modify", "add", "delete"] = "delete" if post is None else "add" if pre is None else "modify"
            run.update(files=(*run.draft.files, FileReport(path=path, action=action, pre_sha256=None, post_sha256=found,
                                                           expected_pre_sha256=pre, expected_post_sha256=post)))
            if found != post:
                problems.append(f"{path} is " + ("missing" if found is None else "there, and the series deletes it"
                                                  if post is None else "not the series' post-image"))

    with run.step("integrity"):
        magic = minor_magic(site.python)
        interpreter = interpreter_for(magic, site.python or "", request.python) if magic is not None else None
        found_all = assess(site, patchsets, python=interpreter)
        if found_all.bytecode_unrecompiled:
            raise EnvironmentProblem(
                f"{where} holds the patched modules' Python {site.python} bytecode "
                f"({found_all.bytecode_unrecompiled[0]}), and this host has no Python {site.python} to recompile "
                "it (its header alone proves nothing)",
                hint=f"name one with --python PATH, or verify from a host with python{site.python}")
        row = row_of(where, site, found_all)
        # the patched modules' bytecode, recompiled and compared by that assessment
        run.update(integrity=replace(_integrity(row, site), bytecode_checked=found_all.bytecode_proven))
        states = dict(row.patch_sets)
        problems += [f"patch set {i} is {states.get(i, 'unknown')} here, not applied" for i in ids
                     if states.get(i) != "applied"]
        for p in superseded:
            record = p.superseded_for(site.release)
            assert record is not None
            if states.get(str(p.id)) != "superseded":
                problems.append(f"patch set {p.id} is {states.get(str(p.id), 'unknown')} here, not superseded: "
                                f"the files record {record.name} was proven on differ")
            else:
                run.notes.append(f"{p.id} is superseded in {site.distribution} {site.release}: {record.upstream} "
                                 f"({record.where[0]}); its files are the ones record {record.name} was proven on; "
                                 "`verify --image` runs its effect cases")
        problems += [f"patch set {other} is applied too, and is not in the series" for other, state in row.patch_sets
                     if state == "applied" and other not in ids and not _explained(other, final, patchsets, site.release)]
        problems += _row_problems(row)

    if not series:   # every set is superseded: the image is the release itself, with nothing of ours
        run.skipped("labels", "superseded: nothing of the series is carried")
        run.skipped("layer", "superseded: nothing of the series is carried")
        run.skipped("probe", "--via registry runs nothing of the image; `verify --image` runs the effect cases")
        if problems:
            raise VerifyMismatch(f"{where} does not carry exactly the release: " + "; ".join(problems[:3]),
                                 hint="rebuild the image from the release")
        return run.report("verified")

    with run.step("labels"):
        problems += _label_problems(labels, series, variants, final)

    with run.step("layer"):
        _, blobs = parse_image_manifest(manifest)
        dist = Distribution(name=site.distribution, version=site.release, location=site.location, python="",
                            python_version=site.python or "", cache_tag=cache_tag(site.python) or "",
                            record_file=None, record=())
        ours = top_layer_problems(OurLayer(image_id=config.digest, named=" + ".join(ids), files=final), scans, dist)
        problems += ours
        if not ours:
            run.notes.append(f"the top layer ({blobs[-1].digest[:19]}) holds only the series' files, their "
                             "bytecode and the folders above them, each with the mode and owner apply writes")
    if row.unverified:
        run.notes.append(f"{len(row.unverified)} thing(s) status could not prove: {'; '.join(row.unverified[:2])}")
    run.skipped("probe", "--via registry runs nothing of the image; `verify --image` runs the probe")
    if problems:
        more = f" (and {len(problems) - 3} more; see the report)" if len(problems) > 3 else ""
        raise VerifyMismatch(f"{where} does not carry exactly {' + '.join(ids)}: " + "; ".join(problems[:3]) + more,
                             hint="verify the image the series was published as, or apply it to the source and publish again")
    return run.report("verified")


def _series(request: RegistryVerifyRequest, labels: dict[str, str], run: RunLog,
            patchsets: list[PatchSet]) -> list[PatchSet]:
    """The patch sets verified, in order: those named, else those the labels name (when every one
    is a known patch set: labels only choose what is checked), else the shipped default."""
    if request.patches or request.series_file is not None:
        chosen = list(load(request.patches, series_file=request.series_file))   # order and `requires` checked
    else:
        carried = labels.get(SERIES_LABEL)
        ids = label_ids(carried) if carried is not None else (labels.get(f"{LABEL_PREFIX}.patch.id", ""),)
        by_id = {p.id: p for p in patchsets}
        if ids and len(ids) <= 64 and all(i in by_id for i in ids):
            run.notes.append(f"no patch set named: verifying what the image's labels name, {' + '.join(ids)}")
            chosen = list(load(ids))
        else:
            chosen = list(load(()))
    bare = [p for p in chosen if p.is_bare]
    if bare:
        raise BadInput(f"{bare[0].source.name} is a bare diff: --via registry checks reviewed post-image hashes",
                       hint="name a patch set (an id or folder with patch.toml), or verify --image")
    return chosen


def _explained(other: str, final: dict[str, str | None], patchsets: list[PatchSet], release: str) -> bool:
    """A known patch set reads `applied` when the series' files happen to hold its post-images (one
    it requires, folded in): only a set with a file of its own outside the series is another set."""
    found = next((p for p in patchsets if p.id == other), None)
    if found is None:
        return False
    try:
        files = found.variant_for(release).files
    except DsparkPatchError:
        return False
    return all(path in final and final[path] == reviewed.post_sha256 for path, reviewed in files.items())


def _row_problems(row: ImageStatus) -> list[str]:
    problems = []
    if row.reference is None:
        problems.append("no published wheel is known for this release, so nothing proves its other files: "
                        + ("; ".join(row.unverified[:1]) or "unverified"))
    for what, items in (("differ from the published wheel", row.unexplained), ("are missing", row.missing),
                        ("are not in the published wheel", row.added), ("have RECORD rows unlike the wheel's",
                                                                        row.record_disagrees),
                        ("are bytecode unlike its source", row.bytecode), ("are installer files unlike an installer's",
                                                                           row.installer_findings),
                        ("are other copies of vLLM", row.unimported)):
        if items:
            problems.append(f"{len(items)} file(s) {what}: {', '.join(items[:3])}")
    return problems


def _label_problems(labels: dict[str, str], series: list[PatchSet], variants: list[tuple[PatchSet, Variant]],
                    final: dict[str, str | None]) -> list[str]:
    files_label = labels.get(f"{LABEL_PREFIX}.files")
    if files_label is None:
        return [f"the image has no {LABEL_PREFIX}.* labels (it was not made by dspark-patch)"]
    problems = []
    carried = labels.get(SERIES_LABEL)
    ids = [str(p.id) for p in series]
    if len(series) > 1:
        named = label_ids(carried) if carried is not None else None
        if named is None or list(named) != ids or _series_digests(carried) != [v.diff_sha256 for _, v in variants]:
            problems.append(f"label {SERIES_LABEL} does not name the series {' + '.join(str(i) for i in ids)}")
    elif carried is not None:
        problems.append(f"the image was made from a series ({carried[:120]}), not from {ids[0]} alone")
    else:
        if labels.get(f"{LABEL_PREFIX}.patch.id") != ids[0]:
            problems.append(f"label {LABEL_PREFIX}.patch.id is {labels.get(f'{LABEL_PREFIX}.patch.id')!r}")
        if labels.get(f"{LABEL_PREFIX}.patch.sha256") != variants[0][1].diff_sha256:
            problems.append(f"label {LABEL_PREFIX}.patch.sha256 does not match the diff")
    try:
        listed = json.loads(files_label)
    except (ValueError, RecursionError):
        return problems + [f"label {LABEL_PREFIX}.files is not JSON"]
    if listed != final:
        problems.append(f"label {LABEL_PREFIX}.files does not list the reviewed post-image hashes")
    return problems


def _series_digests(label: str | None) -> list[str] | None:
    try:
        return [str(m["sha256"]) for m in json.loads(label or "")]
    except (ValueError, RecursionError, TypeError, KeyError):
        return None


def _integrity(row: ImageStatus, site: SiteFiles) -> IntegrityReport:
    return IntegrityReport(checked=len(site.hashes), mismatched=row.unexplained,
                           missing=row.missing, added=row.added, reference=row.reference,
                           record_disagrees=row.record_disagrees, unverified=row.unverified,
                           stale_bytecode=row.bytecode, installer_metadata=row.installer_metadata,
                           installer_findings=row.installer_findings)

