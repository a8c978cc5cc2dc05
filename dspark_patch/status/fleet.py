"""Read many targets concurrently (bounded) and gather one `ImageStatus` row each.

A failing target (a missing image, no vLLM, an engine error while reading it) becomes an
error row and never stops the others. Images with the same id are read once.
"""

from __future__ import annotations

import tarfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .. import __version__, ownfiles, routing, unread_env
from ..errors import BadInput, DsparkPatchError, EngineUnreachable, EnvironmentProblem, TargetNotFound, UnfinishedApply
from ..imageref import ImageRef
from ..patchset import PatchSet, available, known, patched_paths
from ..registry.index import check_before_pull
from ..report.status_model import FleetStatus, ImageStatus
from ..routing import Route
from ..targets.base import PullPolicy
from ..targets.caches import seal
from ..targets.caches.scans import ScanCache
from ..targets.views.site_files import SiteFiles
from .assess import Assessment, assess
from .shard import Shard, pick

if TYPE_CHECKING:
    from ..targets.base import ImageInfo, ImageStore
    from ..targets.layers import LayerView

DISTRIBUTION = "vllm"
Via = Literal["auto", "layers", "container", "registry"]
Event = Literal["start", "done"]
ProgressCallback = Callable[[str, Event, ImageStatus | None], None]


@dataclass(frozen=True, kw_only=True)
class StatusRequest:
    images: tuple[str, ...] = ()
    roots: tuple[str, ...] = ()
    platform: str | None = None
    pull: PullPolicy = "never"
    jobs: int = 4
    via: Via = "auto"
    key: str | None = None   # a public key (PEM): also report each applied patch set's attestation
    shard: Shard | None = None  # read only this share of roots + images (status/shard.py)
    cache_max: int | None = None   # the scan cache's bound in bytes (None: DSPARK_PATCH_CACHE_MAX or 1 GiB)
    connections: int | None = None  # clients open to one registry at once (None: DSPARK_PATCH_REGISTRY_CONNECTIONS or 8)

    def __post_init__(self) -> None:
        # Before any work: a password in a reference would reach the engine, the registry and the
        # report's rows. Other malformed references are each image's own "not read" row.
        for ref in self.images:
            ImageRef.refuse_userinfo(ref)


REFS_LIMIT = 16 << 20   # --images-from: a line per image; a fleet of 100,000 is a few MB


def read_refs_file(path: Path) -> tuple[str, ...]:
    """--images-from: one reference per line; blank lines and `#` comments ignored."""
    raw = ownfiles.read_regular(path, limit=REFS_LIMIT, what="--images-from")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"--images-from {path}: cannot read it (not UTF-8 text)",
                       hint="give a text file with one image reference per line") from None
    refs = []
    for number, line in enumerate(text.splitlines(), 1):
        ref = line.split("#", 1)[0].strip()
        if not ref:
            continue
        if any(c.isspace() for c in ref):
            raise BadInput(f"--images-from {path}:{number}: {ref!r} is not one image reference",
                           hint="one reference per line")
        refs.append(ref)
    if not refs:
        raise BadInput(f"--images-from {path}: no image references in it", hint="one reference per line")
    return tuple(refs)


def row_from_site(ref: str, site: SiteFiles, patchsets: Sequence[PatchSet], config: Mapping[str, Any] | None = None,
                  **extra: str | None) -> ImageStatus:
    """The row; with the image's `config`, also a note per variable it sets that nothing reads (unread_env.py)."""
    row = row_of(ref, site, assess(site, patchsets), **extra)
    if config is None:
        return row
    return replace(row, notes=tuple(unread_env.notes(unread_env.settings(config), patchsets, site.retained.get,
                                                     distribution=site.distribution, release=site.release)))


def row_of(ref: str, site: SiteFiles, found: Assessment, **extra: str | None) -> ImageStatus:
    """The row of a site folder status assessed (a caller that needs more of the assessment keeps it)."""
    row = ImageStatus(ref=ref, location=site.location, release=site.release, python=site.python,
                      patch_sets=found.patch_sets, unexplained=found.unexplained, missing=found.missing,
                      added=found.added, unimported=site.unimported, reference=found.reference,
                      record_disagrees=found.record_disagrees, bytecode=found.bytecode,
                      unverified=found.unverified, installer_metadata=found.installer,
                      installer_findings=found.installer_findings, **extra)  # type: ignore[arg-type]
    return replace(row, exit_code=1 if row.findings else 0)


def unreadable(ref: str, exc: Exception) -> DsparkPatchError:
    """Hostile data the readers did not foresee (a value no parser expected) is that image's
    row error, in one line, never a traceback that loses every other row."""
    return BadInput(f"{ref}: could not be read ({type(exc).__name__}: {str(exc)[:200]})",
                    hint="the image's files are malformed; rebuild it")


def _error_row(ref: str, exc: DsparkPatchError, **extra: str | None) -> ImageStatus:
    # An image that is there but holds no vLLM was read: it is a finding (1), not bad input.
    code = exc.exit_code
    if isinstance(exc, TargetNotFound) and extra.get("id"):
        code = 1
    return ImageStatus(ref=ref, error=exc.line(), exit_code=code, **extra)  # type: ignore[arg-type]


def _refuse_unfinished(root: Path) -> None:
    """A tree an apply was killed in the middle of: its files say nothing settled (some
    renamed, some not; compiled and probed or not) until the next apply finishes or undoes it
    from its journal (targets/journal.py), so the row is that, exit 1, as verify says it."""
    from ..targets import journal

    if root.is_dir() and journal.exists(root):
        raise UnfinishedApply(f"--root {root}: an apply of this tree was interrupted and is not finished (its journal "
                              f"{journal.path_of(root)} is there)",
                              hint="run the same apply again: it finishes or undoes the interrupted one")


def status(request: StatusRequest, *, on_progress: ProgressCallback | None = None) -> FleetStatus:
    started = datetime.now(UTC)
    noted = set(seal.notes())
    clock = time.monotonic()
    patchsets = known(available())
    verifier = None
    if request.key is not None:  # a bad key is bad input before any image is read
        from ..attest.dsse import load_verifier

        verifier = load_verifier(Path(request.key))
    progress = on_progress or (lambda ref, event, row: None)
    rows: dict[str, ImageStatus] = {}
    shard = None
    if request.shard is not None:
        whole = list(dict.fromkeys([*request.roots, *request.images]))
        shard = pick(whole, request.shard)
        mine = {whole[i] for i in shard.positions}
        request = replace(request, roots=tuple(r for r in request.roots if r in mine),
                          images=tuple(r for r in request.images if r in mine))

    for root in request.roots:
        from ..targets.views.from_folder import read_site

        progress(root, "start", None)
        try:
            _refuse_unfinished(Path(root))
            rows[root] = row_from_site(root, read_site(Path(root), DISTRIBUTION, retain=patched_paths(patchsets)), patchsets)
        except DsparkPatchError as exc:
            rows[root] = _error_row(root, exc)
        except OSError as exc:
            rows[root] = _error_row(root, BadInput(f"--root {root}: cannot read it ({exc.strerror or exc})"))
        except (ValueError, LookupError, TypeError, UnicodeError, tarfile.TarError) as exc:
            rows[root] = _error_row(root, unreadable(root, exc))
        rows[root] = replace(rows[root], route=routing.LOCAL)
        progress(root, "done", rows[root])

    # An image read from an index in its registry has one row per platform (--via registry).
    many: dict[str, tuple[ImageStatus, ...]] = {ref: (row,) for ref, row in rows.items()}
    if request.images:
        many.update(_read_images(request, patchsets, progress))
    if verifier is not None:
        from .attested import with_attestations

        by_id = {p.id: p for p in patchsets if p.id}
        registries: dict = {}
        for ref in request.images:
            many[ref] = tuple(with_attestations(row, verifier, by_id, registries) for row in many[ref])
    order = [*request.roots, *request.images]
    return FleetStatus(images=tuple(row for ref in dict.fromkeys(order) for row in many[ref]), tool_version=__version__,
                       started_at=started.isoformat(timespec="seconds").replace("+00:00", "Z"),
                       seconds=round(time.monotonic() - clock, 3), shard=shard,
                       patch_set_digests=tuple((p.id, p.content_sha256) for p in patchsets if p.id),
                       notes=tuple(dict.fromkeys([*(n for n in seal.notes() if n not in noted),
                                                  *(f"{row.ref}: {n}" for rows in many.values() for row in rows
                                                    for n in row.notes)])))


def scan_cache(request: StatusRequest, patchsets: Sequence[PatchSet]) -> ScanCache:
    """The layer-scan cache for this run's predicate (targets/caches/scans.py)."""
    from ..targets.views.from_layers import status_retain_identity

    return ScanCache.from_env(status_retain_identity(DISTRIBUTION, patched_paths(patchsets)), request.cache_max)


def _from_registry(request: StatusRequest, patchsets: Sequence[PatchSet], progress: ProgressCallback,
                   refs: Sequence[str], route: Route | Callable[[str], Route], *,
                   absent_ok: bool = False) -> dict[str, tuple[ImageStatus, ...] | None]:
    """Rows read from the registry, each naming `route` (or the one `route` gives its reference)."""
    from ..registry.pool import pool_size
    from .registry_route import RegistryReader, read_all

    def routed(ref: str, row: ImageStatus | None) -> ImageStatus | None:
        return None if row is None else replace(row, route=route if isinstance(route, Route) else route(ref))

    reader = RegistryReader(patchsets=patchsets, retain_paths=patched_paths(patchsets), cache=scan_cache(request, patchsets),
                            platform=request.platform, row=row_from_site, error_row=_error_row, unreadable=unreadable,
                            connections=pool_size(request.connections))
    read = read_all(reader, refs, jobs=request.jobs, absent_ok=absent_ok,
                    progress=lambda ref, event, row: progress(ref, event, routed(ref, row)))
    return {ref: None if rows is None else tuple(r for row in rows if (r := routed(ref, row)) is not None)
            for ref, rows in read.items()}


def _read_images(request: StatusRequest, patchsets: Sequence[PatchSet],
                 progress: ProgressCallback) -> dict[str, tuple[ImageStatus, ...]]:
    refs = list(dict.fromkeys(request.images))
    asked = routing.status_registry(request.via)
    if asked is not None:
        return {ref: rows or () for ref, rows in _from_registry(request, patchsets, progress, refs, asked).items()}
    try:
        found, route = _read_engine(request, patchsets, progress, refs)
    except EngineUnreachable:
        # auto, and no engine answers: the registry route when every image names its registry
        instead = routing.status_without_engine(request.via, refs)
        if instead is None:
            raise
        return {ref: rows or () for ref, rows in _from_registry(request, patchsets, progress, refs, instead).items()}
    out: dict[str, tuple[ImageStatus, ...]] = {
        ref: (row,) for ref, row in found.items() if not isinstance(row, DsparkPatchError)}
    absent = [ref for ref, row in found.items() if isinstance(row, DsparkPatchError)]
    # auto: an image the engine lacks (and was not asked to pull) is read from its registry when
    # the registry has it; otherwise its row is the engine's "not found".
    fallback = {ref: r for ref in absent if (r := routing.status_absent(request.via, request.pull, ref)) is not None}
    if fallback:
        for ref, rows in _from_registry(request, patchsets, progress, list(fallback), fallback.__getitem__,
                                        absent_ok=True).items():
            if rows is not None:
                out[ref] = rows
    for ref in absent:
        if ref not in out:
            error = found[ref]
            assert isinstance(error, DsparkPatchError)
            out[ref] = (replace(_error_row(ref, error), route=route),)
            progress(ref, "done", out[ref][0])
    return out


def _read_engine(request: StatusRequest, patchsets: Sequence[PatchSet], progress: ProgressCallback,
                 refs: Sequence[str]) -> tuple[dict[str, ImageStatus | DsparkPatchError], Route]:
    """Rows read through the engine, each naming the run's route (which is returned too); a
    reference the engine lacks is its `TargetNotFound`."""
    from ..targets import open_store

    engine = open_store()  # unreachable: EngineUnreachable (the whole command exits 3 unless auto reads a registry)
    rows: dict[str, ImageStatus | DsparkPatchError] = {}
    by_id: dict[str, list[str]] = {}
    infos: dict[str, ImageInfo] = {}  # by image id: the one inspect each image gets
    for ref in refs:  # cheap: one inspect each; groups tags of one image so it is read once
        try:
            if request.pull != "never":
                if request.pull == "always" or not engine.tag_exists(ref):
                    # An index listing a platform twice would have the engine pick one silently.
                    check_before_pull(ref)
                engine.ensure_image(ref, pull=request.pull, platform=request.platform)
            info = engine.image_info(ref)
            infos.setdefault(info.id, info)
            by_id.setdefault(info.id, []).append(ref)
        except TargetNotFound as exc:
            rows[ref] = exc
        except DsparkPatchError as exc:
            rows[ref] = _error_row(ref, exc)
            progress(ref, "done", rows[ref])  # type: ignore[arg-type]

    # One image: its site folder through the archive API is the cheaper read (the engine sends
    # about half what a save of all its layers is), unless the scan cache holds all its layers
    # (then nothing is read at all). Several: one save shares their common layers.
    # --platform is handed to the engine's create, so it needs the container route.
    cache = scan_cache(request, patchsets)
    route = routing.status_engine(request.via, platform=request.platform, images=len(by_id),
                                  all_cached=lambda: all(_all_cached(infos[image_id], cache) for image_id in by_id))
    rows = {ref: row if isinstance(row, DsparkPatchError) else replace(row, route=route) for ref, row in rows.items()}
    progress = _routing(progress, route)
    if route.name == "layers" and by_id:
        read = _read_layers(engine, by_id, infos, patchsets, progress, cache)
        return {**rows, **{ref: row if isinstance(row, DsparkPatchError) else replace(row, route=route)
                           for ref, row in read.items()}}, route

    def read_one(image_id: str, names: list[str]) -> ImageStatus:
        ref = names[0]
        for name in names:
            progress(name, "start", None)
        extra: dict[str, str | None] = {"id": image_id}
        try:
            with engine.open_reader(ref, platform=request.platform, image_id=image_id) as reader:
                extra["platform"] = reader.image_platform
                return row_from_site(ref, reader.read_site(DISTRIBUTION, retain=patched_paths(patchsets)), patchsets,
                                     config=infos[image_id].config, **extra)
        except DsparkPatchError as exc:
            return _error_row(ref, exc, **extra)
        except (ValueError, LookupError, TypeError, UnicodeError, tarfile.TarError) as exc:
            return _error_row(ref, unreadable(ref, exc), **extra)

    # The readers' containers are made on the pool's threads, which no signal reaches: a SIGTERM
    # removes them from here, and the images not yet begun are dropped, so the run ends now
    # (exit 143) with none left behind.
    with ThreadPoolExecutor(max_workers=max(1, request.jobs), thread_name_prefix="status") as pool:
        try:
            with engine.removed_on_term():
                futures = {pool.submit(read_one, image_id, names): image_id for image_id, names in by_id.items()}
                for future in as_completed(futures):
                    image_id, row = futures[future], future.result()
                    for name in by_id[image_id]:
                        rows[name] = named = replace(row, ref=name, route=route)
                        progress(name, "done", named)
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)
            raise
    return rows, route


def _routing(progress: ProgressCallback, route: Route) -> ProgressCallback:
    """`progress`, its finished rows naming `route`."""
    return lambda ref, event, row: progress(ref, event, None if row is None else replace(row, route=route))


def _read_layers(engine: ImageStore, by_id: dict[str, list[str]], infos: dict[str, ImageInfo],
                 patchsets: Sequence[PatchSet], progress: ProgressCallback, cache: ScanCache) -> dict[str, ImageStatus | DsparkPatchError]:
    """All images from one save of their layers: a layer shared by many is read once. An image
    whose every layer (RootFS.Layers, the diff_ids) is in the scan cache is not saved at all."""
    from ..targets.views.from_layers import find_site, merge_scans

    for names in by_id.values():
        for name in names:
            progress(name, "start", None)
    rows: dict[str, ImageStatus | DsparkPatchError] = {}
    failure: DsparkPatchError | None = None
    views: dict[str, LayerView | DsparkPatchError] = {}
    to_save = []
    for image_id in by_id:
        diff_ids = infos[image_id].diff_ids
        scans = [cache.get(d) for d in diff_ids]
        cached = [s for s in scans if s is not None]
        if not diff_ids or len(cached) != len(diff_ids):
            to_save.append(image_id)
            continue
        try:
            views[image_id] = merge_scans(cached, where=f"image {image_id[:19]}")
        except DsparkPatchError as exc:
            views[image_id] = exc
    try:
        if to_save:
            views.update(engine.save_views(to_save, DISTRIBUTION, retain=patched_paths(patchsets), cache=cache))
    except DsparkPatchError as exc:
        failure = exc
    except (ValueError, LookupError, TypeError, UnicodeError, tarfile.TarError) as exc:
        failure = unreadable("the images' layers", exc)
    for image_id, names in by_id.items():
        info = infos[image_id]
        extra: dict[str, str | None] = {"id": image_id, "platform": info.platform}
        view = views.get(image_id)
        if failure is not None:
            row = _error_row(names[0], failure, **extra)
        elif view is None:
            row = _error_row(names[0], EnvironmentProblem(f"the engine's save of {names[0]} lacks its manifest or one of its layers",
                                                         hint="read it alone: dspark-patch status --via container"), **extra)
        elif isinstance(view, DsparkPatchError):
            row = _error_row(names[0], view, **extra)
        else:
            try:
                row = row_from_site(names[0], find_site(view, DISTRIBUTION, info.config, names[0]), patchsets,
                                    config=info.config, **extra)
            except DsparkPatchError as exc:  # this image's row; the others stay
                row = _error_row(names[0], exc, **extra)
            except (ValueError, LookupError, TypeError, UnicodeError) as exc:
                row = _error_row(names[0], unreadable(names[0], exc), **extra)
        for name in names:
            rows[name] = named = replace(row, ref=name)
            progress(name, "done", named)
    return rows


def _all_cached(info: ImageInfo, cache: ScanCache) -> bool:
    return bool(info.diff_ids) and all(cache.has(d) for d in info.diff_ids)
