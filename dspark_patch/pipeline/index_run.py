"""apply / verify / probe over an image index: each chosen platform on its own, then one index.

A serving tag is often an index (linux/amd64 for x86 GPU hosts, linux/arm64 for Grace hosts).
Each platform's image is pulled by the digest the index names and run through the very same
single-image core (`commands`): zero-fuzz plan, hash checks, compile and probe with that
platform's python (under emulation on a foreign one), exact layer, commit. Only when every
platform passed are the results tagged, pushed and listed in a new index of the source's kind
(`registry.index.republish`: the source's platforms, order, platform fields and annotations).

Whether a request names an index is not decided here: `resolve.py` did, once, and hands in the
index it read and the run's one store (`IndexSource`). This module only loops over platforms,
names the results and publishes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ..errors import BadInput, DsparkPatchError, TagExists, TargetNotFound
from ..imageref import ImageRef
from ..registry.index import ImageIndex, Registry
from ..registry.platform_select import Platform, select
from ..report.model import (
    AuditReport,
    Command,
    ErrorReport,
    ImageRecord,
    IndexReport,
    PlatformReport,
    Status,
    TargetReport,
)
from ..routing import platform_container
from ..targets.base import ImageStore
from .requests import ApplyRequest, ImageSpec, ProbeRequest, VerifyRequest
from .resolve import ImageSource, IndexSource
from .runlog import ResultCallback, RunLog, StepCallback

Request = ApplyRequest | VerifyRequest | ProbeRequest
# The single-target core (`commands.apply/verify/probe`, its callbacks bound): (request, *,
# source, on_step) -> AuditReport.
Single = Callable[..., AuditReport]


def run_index(command: Command, request: Request, source: IndexSource, single: Single, run: RunLog,
              on_result: ResultCallback | None = None) -> AuditReport:
    """Every chosen platform of `source.index` through `single`, then tag and push (apply).
    `run` is the run that read the index (its "read index" step); it becomes the whole report."""
    flow = _IndexRun(command=command, request=request, source=source, single=single, run=run, on_result=on_result)
    try:
        return flow.execute()
    except DsparkPatchError as exc:
        return flow.finish(error=exc)


# A Docker tag is at most 128 characters ([A-Za-z0-9_][A-Za-z0-9_.-]{0,127}).
TAG_LIMIT = 128


def platform_tag(tag: str, platform: Platform) -> str:
    """`reg/repo:1.0` + linux/arm64/v8 -> `reg/repo:1.0-linux-arm64-v8`: where each patched
    platform image is tagged (and pushed) before the index that lists them.

    Injective: platform parts are `[a-z0-9]+` (refused otherwise, `Platform.tag_suffix`), so
    the `-` between them cannot come from inside one; `linux/arm64/v8` is `-linux-arm64-v8`
    and `linux/arm64-v8` is refused, never the same tag."""
    ref = ImageRef.parse(tag)
    result = f"{ref.tag_or_latest}-{platform.tag_suffix}"
    if len(result) > TAG_LIMIT:
        raise BadInput(f"the {platform} image's tag {result!r} is longer than a tag may be ({TAG_LIMIT})",
                       hint="choose a shorter --tag")
    return str(ref.with_tag(result))


@dataclass(kw_only=True)
class _IndexRun:
    command: Command
    request: Request
    source: IndexSource
    single: Single
    run: RunLog
    on_result: ResultCallback | None = None

    @property
    def spec(self) -> ImageSpec:
        return self.source.spec

    @property
    def index(self) -> ImageIndex:
        return self.source.index

    def execute(self) -> AuditReport:
        run, spec, index = self.run, self.spec, self.index
        run.update(index=IndexReport(ref=spec.ref, media_type=index.manifest.media_type,
                                     digest=index.manifest.digest, platforms=tuple(map(str, index.platforms))))
        store = self.source.store()  # the run's one store (EngineUnreachable here: after the index is named)
        os_, arch, variant = store.platform()
        native = Platform(os=os_, architecture=arch, variant=variant)
        chosen = select(index.platforms, spec.platform, native)
        others = [str(p) for p in index.platforms if p not in chosen]
        if spec.platform is None and others:
            run.notes.append(f"the index also has {', '.join(others)}; only the engine's own platform "
                             f"{chosen[0]} was {self._done()} (choose with --platform, or --platform all)")
        writes = isinstance(self.request, ApplyRequest) and not self.request.dry_run
        if writes and spec.push and others:
            raise BadInput(
                f"--push publishes one index with every platform of {spec.ref}, but {', '.join(others)} "
                "would not be patched",
                hint="add --platform all",
            )
        tags = {p: platform_tag(spec.tag, p) for p in chosen} if spec.tag and writes else {}
        if len(set(tags.values())) != len(tags):  # cannot happen with plain platform parts; never tag twice
            raise BadInput(f"two platforms of {spec.ref} would get the same tag: {sorted(tags.values())}")
        for tag in tags.values():
            store.refuse_existing_tag(tag, force=spec.force)
        if tags and spec.push and spec.tag:
            self._refuse_existing_index(spec.tag)

        reports = [self._one(store, p, native) for p in chosen]
        run.update(platforms=tuple(reports))
        failed = [r for r in reports if not r.report.ok]
        if failed:
            if writes:
                run.update(platforms=tuple(self._discard(store, reports)))
            return self.finish(failed=failed)
        if tags:
            reports = self._tag(store, reports, tags)
            run.update(platforms=tuple(reports))
        if tags and spec.push and spec.tag:
            self._publish(store, reports, tags, spec.tag)
        elif tags:
            run.notes.append("each platform image is tagged on the engine; --push publishes them and the index")
        return self.finish()

    def _refuse_existing_index(self, tag: str) -> None:
        host = ImageRef.host_of(tag)
        if host is None:
            raise BadInput(f"--tag {tag} names no registry host to push the index to",
                           hint="write HOST[:PORT]/REPO:TAG")
        try:
            found = Registry(host).fetch(tag)
        except TargetNotFound:
            return
        if not self.spec.force:
            raise TagExists(f"{tag} already exists in its registry ({found.digest})",
                            hint="choose another --tag, or pass --force to replace it")

    def _done(self) -> str:
        return {"apply": "patched", "verify": "verified", "probe": "probed"}[self.command]

    def _one(self, store: ImageStore, platform: Platform, native: Platform) -> PlatformReport:
        entry = self.index.entry_for(platform)
        ref = str(ImageRef.parse(self.spec.ref).with_digest(entry.digest))
        emulated = not platform.matches(native)
        route = platform_container(str(platform), self.spec.ref)
        sub_run = RunLog.start(self.command, TargetReport(kind="image", ref=ref), self._prefixed(platform), route=route)
        try:
            with sub_run.step("pull"):
                # The manifest the index names is read first: it must be an image manifest of
                # the size the index says (the engine checks only the digest).
                host = ImageRef.host_of(self.spec.ref)
                assert host is not None  # an index was read from it
                Registry(host).fetch_platform(self.index, platform)
                # By digest, so the engine gets exactly the manifest the index names, and for the
                # platform, so it does not refuse an image of another architecture.
                store.ensure_image(ref, pull="missing", platform=str(platform))
            if emulated:
                with sub_run.step("emulation"):
                    store.check_emulation(store.image_info(ref).id, str(platform))
        except DsparkPatchError as exc:
            report = sub_run.report("failed", exc)
        else:
            # Pulled by digest above; the platform's python is found (or --python used) as for any image.
            target = replace(self.spec, ref=ref, tag=None, push=False, platform=None, pull="never")
            one = ImageSource(spec=target, store=self.source.store, kind="engine", route=route)
            report = self.single(replace(self.request, target=target), source=one, on_step=self._prefixed(platform))
            report = replace(report, steps=tuple(sub_run.steps) + report.steps)
        return PlatformReport(platform=str(platform), source_manifest=entry.digest, emulated=emulated, report=report)

    def _prefixed(self, platform: Platform) -> StepCallback | None:
        outer = self.run.on_step
        if outer is None:
            return None
        return lambda step: outer(replace(step, name=f"{platform} {step.name}"))

    def _discard(self, store: ImageStore, reports: list[PlatformReport]) -> list[PlatformReport]:
        """A run that failed on one platform leaves no new image from the others (they were
        committed untagged, so nothing else refers to them)."""
        kept = []
        for r in reports:
            image = r.report.result_image
            if r.report.status == "applied" and image is not None:
                store.remove_image(image.id)
                note = f"removed the committed image {image.id[:19]}: another platform failed"
                r = replace(r, report=replace(r.report, result_image=None, notes=(*r.report.notes, note)))
            kept.append(r)
        return kept

    def _tag(self, store: ImageStore, reports: list[PlatformReport], tags: dict[Platform, str]) -> list[PlatformReport]:
        """Every platform image named, or none: the report set is written first (as it reads
        once they are named); a name that fails (another run took it meanwhile) takes back the
        names this run set and removes the images it made, and the run fails."""
        tagged = []
        for r in reports:
            image = r.report.result_image or r.report.target.image
            assert image is not None  # an applied or already-applied image run names its result
            tag = tags[Platform.parse(r.platform)]
            tagged.append(replace(r, report=replace(r.report, result_image=ImageRecord(ref=tag, id=image.id))))
        named: list[str] = []
        try:
            if self.on_result is not None:
                self.run.update(platforms=tuple(tagged))
                try:
                    self.on_result(self.finish())
                finally:
                    self.run.update(platforms=tuple(reports))
            with self.run.step("tag"):
                for r in tagged:
                    assert r.report.result_image is not None
                    store.tag(r.report.result_image.id, r.report.result_image.ref, force=self.spec.force)
                    named.append(r.report.result_image.ref)
        except BaseException:
            for tag in named:  # the name goes, and a new image with it (a source image keeps its own)
                store.remove_image(tag)
            self.run.update(platforms=tuple(self._discard(store, reports)))
            if named:
                self.run.notes.append(f"took back the names this run had set: {', '.join(named)}")
            raise
        return tagged

    def _publish(self, store: ImageStore, reports: list[PlatformReport], tags: dict[Platform, str], index_tag: str) -> None:
        host = ImageRef.host_of(index_tag)
        assert host is not None  # checked before any work by _refuse_existing_index
        registry = Registry(host)
        patched = {}
        published = []
        for r in reports:
            platform = Platform.parse(r.platform)
            tag = tags[platform]
            with self.run.step(f"push {platform}"):
                digest = store.push(tag)
                manifest = registry.fetch(str(ImageRef.parse(tag).with_digest(digest)))
            # The index entry is matched by the source's own platform value, variant included.
            listed = self.index.entry_for(platform).platform
            assert listed is not None  # entry_for only finds entries that name a platform
            patched[listed] = manifest
            image = r.report.result_image
            assert image is not None
            result = replace(image, repo_digest=str(ImageRef.parse(tag).with_digest(digest)))
            published.append(replace(r, result_manifest=digest, report=replace(r.report, result_image=result)))
        self.run.update(platforms=tuple(published))
        from ..registry.index import republish

        with self.run.step("push index"):
            body = republish(self.index, patched)
            pushed = registry.push(index_tag, body, self.index.manifest.media_type)
        assert self.run.draft.index is not None
        self.run.update(index=replace(self.run.draft.index, result_ref=index_tag, result_digest=pushed.digest))
        self.run.notes.append(f"pushed the index {index_tag} ({pushed.digest}) listing "
                              f"{len(published)} patched platform image(s)")

    def finish(self, *, failed: Sequence[PlatformReport] = (), error: DsparkPatchError | None = None) -> AuditReport:
        """The whole run's verdict: failed if the index-level work or any platform failed."""
        if error is not None:
            return self.run.report("failed", error)
        if failed:
            worst = max(failed, key=lambda r: r.report.exit_code)
            first = worst.report.errors[0] if worst.report.errors else None
            message = f"{worst.platform}: {first.message if first else 'failed'}"
            if len(failed) > 1:  # each platform's own error is in its section of the report
                message += f" (also failed: {', '.join(r.platform for r in failed if r is not worst)})"
            if self.command == "apply":
                message += "; nothing was tagged or pushed"
            report = self.run.report("failed")
            return replace(report, status="failed", exit_code=worst.report.exit_code, errors=(ErrorReport(
                kind=first.kind if first else "platform-failed", message=message,
                hint=first.hint if first else None, exit_code=worst.report.exit_code),))
        statuses = {r.report.status for r in self.run.draft.platforms}
        status: Status
        if self.command == "verify":
            status = "verified"
        elif self.command == "probe":
            status = "probed"
        elif statuses == {"dry-run"}:
            status = "dry-run"
        elif statuses == {"already-applied"}:
            status = "already-applied"
        else:
            status = "applied"
        return self.run.report(status)


__all__ = ["platform_tag", "run_index"]
