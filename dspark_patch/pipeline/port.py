"""`port` as steps: patch set -> target release's files -> exact merge -> checks -> new variant.

A first call merges every file of the source variant onto the target release's pristine file
(porting/merge.py) and writes the results into the work folder; a file that does not land
exactly is a conflict for a person to resolve there. A call that finds the work folder re-checks
it: no markers left, the files compile with the target's python, the patch set's probe passes on
the target with the candidate applied. Only then is the variant written into the patch set,
"unreviewed", with its review file. Before any of that the probe's census of the pristine
target is read: a release where the buffer has a reader on the DSpark V2 path without a None
check cannot take the patch as it is (0.31.0), and is refused naming each reader.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import replace
from pathlib import Path

from .. import ownfiles
from ..errors import (
    BadInput,
    CheckFailed,
    CompileFailed,
    DsparkPatchError,
    InvalidPatchSet,
    PortConflict,
    PortRefused,
    ProbeFailed,
    TargetNotFound,
)
from ..patching.diff import Diff, parse_diff
from ..patching.plan import FilePlan, PatchPlan, plan_patch
from ..patchset import PatchSet, Variant, load_dir, resolve
from ..porting import review as review_md
from ..porting.merge import FileMerge, leftover_markers, merge_file
from ..porting.source import tree_from_root, tree_from_wheel
from ..porting.variant import BACKUP, CandidateFile, forget_backup, make_diff, sha256, toml_table, undo_variant, write_variant
from ..porting.workdir import WorkDir, WorkFile, WorkState
from ..probe.run import run_probe, unguarded_readers
from ..report.model import CensusEntry, ErrorReport, ProbeReport
from ..report.port_model import PortFileReport, PortFileStatus, PortReport
from ..series import load
from ..targets.base import Distribution, Target
from .requests import PortRequest
from .shared_steps import compiled_rows


def port(request: PortRequest, *, earlier: tuple[PatchSet, ...] = ()) -> PortReport:
    """`earlier`: the members of a series before this one, each with a variant for the release
    (ported or not): applied to the release's files first, so this set is merged onto, compiled
    and probed with, their result, and its pre-images are the files after them."""
    report = PortReport(status="failed", exit_code=1, patch=request.patch, source_variant=request.source_variant,
                        release=request.release, work=request.work or "")
    flow = _Flow(request, report, earlier)
    try:
        with ExitStack() as stack:
            flow.run(stack)
    except DsparkPatchError as exc:
        status = flow.report.status if flow.report.status in ("conflict", "refused") else "failed"
        return replace(flow.report, status=status, exit_code=exc.exit_code,
                       error=ErrorReport(kind=exc.kind, message=exc.message, hint=exc.hint, exit_code=exc.exit_code))
    return flow.report


def port_series(request: PortRequest, specs: tuple[str, ...], series_file: str | None = None) -> tuple[PortReport, ...]:
    """Port a series in order: each member without a variant for the release is ported onto the
    release with the members before it applied (their variants for it: ones they had, or the ones
    ported just before), in a work folder of its own under --work. A member that already has one
    is used as it is ("covered"). Stops at the first member that does not get its variant (a
    conflict to resolve, a refusal): run the same command again to go on from there."""
    try:
        members = load(specs, series_file=series_file)
    except DsparkPatchError as exc:
        return (PortReport(status="failed", exit_code=exc.exit_code, patch=None, source_variant=None,
                           release=request.release, work=request.work or "",
                           error=ErrorReport(kind=exc.kind, message=exc.message, hint=exc.hint, exit_code=exc.exit_code)),)
    root = Path(request.work or "dspark-patch-port")
    reports: list[PortReport] = []
    for i, member in enumerate(members):
        work = root / f"{member.id}-{request.release}"
        if any(request.release in v.releases for v in member.variants):
            used = member.variant_for(request.release)
            reports.append(PortReport(status="covered", exit_code=0, patch=member.id, source_variant=used.name,
                                      release=request.release, work=str(work), variant=used.name,
                                      notes=(f"{member.id} has variant {used.name} for {request.release}: used as it is",)))
            continue
        done = port(replace(request, patch=str(member.source), work=str(work)), earlier=members.sets[:i])
        reports.append(done)
        if done.exit_code != 0:
            break
    return tuple(reports)


class _Flow:
    def __init__(self, request: PortRequest, report: PortReport, earlier: tuple[PatchSet, ...] = ()) -> None:
        self.request = request
        self.report = report
        self.earlier = earlier
        self.work = WorkDir(Path(request.work or "dspark-patch-port"))
        self.pristine_probe: ProbeReport | None = None   # the probe on the pristine release

    def update(self, **fields: object) -> None:
        self.report = replace(self.report, **fields)  # type: ignore[arg-type]

    def run(self, stack: ExitStack) -> None:
        request = self.request
        patchset = resolve(request.patch)
        if patchset.id is None:  # a bare diff file
            raise BadInput("port makes a variant of a patch set; a bare diff file has no variants to carry",
                           hint="give a patch-set id or folder (dspark-patch list)")
        variant = _source_variant(patchset, request.source_variant)
        # Port writes the variant into the patch-set folder and its work folder: a link planted
        # under any of those names is refused now, before any work, never written through.
        name = f"{patchset.distribution}-{request.release}"
        ownfiles.check_names(patchset.source, ["patch.toml", f"{name}.patch", f"{name}.review.md",
                                               f"census-{name}.json", BACKUP])
        if request.work is None:  # default: one folder per patch set and release, here
            self.work = WorkDir(Path("dspark-patch-port") / f"{patchset.id}-{request.release}")
        self.update(patch=patchset.id, source_variant=variant.name, work=str(self.work.root))
        covered = {r: v.name for v in patchset.variants for r in v.releases}
        covered.update({r: f"superseded record {s.name}" for s in patchset.superseded for r in s.releases})
        if request.release in covered:
            raise BadInput(f"patch set {patchset.id} already has variant {covered[request.release]} for "
                           f"{patchset.distribution} {request.release}; there is nothing to port",
                           hint="dspark-patch apply uses it; to port again, remove that variant first")
        ownfiles.check_names(self.work.root, ["port.json", "REVIEW.md"])
        state = self.work.load()
        if state is not None and (state.patch, state.source_variant, state.release) != (patchset.id, variant.name, request.release):
            raise BadInput(f"--work {self.work.root} holds a port of {state.patch} {state.source_variant} to "
                           f"{state.release}, not of {patchset.id} {variant.name} to {request.release}",
                           hint="give another --work folder")
        diff = _parse(patchset, variant)

        target = self._open(stack, patchset)
        dist = target.locate(patchset.distribution)
        if dist.version != request.release:
            raise BadInput(f"--to {request.release}, but the given {self._what()} holds {dist.name} {dist.version}",
                           hint=f"pass the {request.release} release's files, or --to {dist.version}")
        for before in self.earlier:   # the series so far, on the release's files
            stack.enter_context(_applied(target, _planned(before, request.release, target)))
        pristine = {fp.path: _pristine(target, fp.path) for fp in diff.files}

        if patchset.probe is not None:
            self._refuse_unguarded(target, dist, patchset)

        if state is None:
            state = self._merge(patchset, variant, diff, pristine, target)
        contents = self._resolved(state, pristine)
        candidates = tuple(CandidateFile(path=fp.path, pre=pristine[fp.path], post=contents[fp.path]) for fp in diff.files)
        if all(c.pre == c.post for c in candidates):
            raise CheckFailed(f"the files in {self.work.root / 'files'} are the release's own: the candidate changes nothing",
                              hint="resolve the conflicts by keeping the variant's change")
        probed = self._check(target, dist, candidates, patchset)
        self._write(patchset, variant, state, candidates, probed)

    # --- steps ------------------------------------------------------------------------------

    def _what(self) -> str:
        r = self.request
        return f"wheel {r.wheel}" if r.wheel else f"tree {r.root}" if r.root else f"image {r.image}"

    def _open(self, stack: ExitStack, patchset: PatchSet) -> Target:
        from ..targets.local_tree import LocalTree

        r = self.request
        if sum(x is not None for x in (r.wheel, r.root, r.image)) != 1:
            raise BadInput("give exactly one source of the target release's files: --wheel FILE, --root DIR or --image REF",
                           hint="see dspark-patch port --help")
        if r.wheel is not None:
            return LocalTree(tree_from_wheel(Path(r.wheel), self.work.tree), python=r.python)
        if r.root is not None:
            return LocalTree(tree_from_root(Path(r.root), self.work.tree, package=patchset.distribution), python=r.python)
        from ..targets import open_store

        assert r.image is not None
        return stack.enter_context(open_store().open_image(r.image, python=r.python, pull=r.pull))

    def _refuse_unguarded(self, target: Target, dist: Distribution, patchset: PatchSet) -> None:
        assert patchset.probe is not None
        self.pristine_probe = run_probe(target, dist, patchset.probe, modules=patchset.probe_modules)
        readers = unguarded_readers(self.pristine_probe)
        if not readers:
            return
        self.update(status="refused", unguarded=readers)
        raise PortRefused(
            f"{dist.name} {dist.version} cannot take this patch as it is: {len(readers)} reader(s) of the buffer on the "
            "DSpark V2 path have no None check: " + "; ".join(reader_line(e) for e in readers),
            hint="no variant was written; making the release safe would take a change to those readers "
            "(no longer allocation-only), see docs/porting.md",
        )

    def _merge(self, patchset: PatchSet, variant: Variant, diff: Diff, pristine: dict[str, bytes],
               target: Target) -> WorkState:
        merges: list[FileMerge] = [merge_file(fp, pristine[fp.path]) for fp in diff.files]
        assert patchset.id is not None
        state = WorkState(patch=patchset.id, source_variant=variant.name, release=self.request.release, files=tuple(
            WorkFile(path=m.path, status=m.status, theirs_sha256=sha256(m.theirs),
                     conflicts=tuple(c.line() for c in m.conflicts)) for m in merges))
        self.work.save(state, {m.path: m.result for m in merges})
        self.update(files=tuple(PortFileReport(
            path=m.path, status=m.status, offsets=tuple(p.offset for p in m.placements),
            conflicts=tuple(c.line() for c in m.conflicts), work_file=str(self.work.root / "files" / m.path),
        ) for m in merges))
        conflicts = [c for m in merges for c in m.conflicts]
        if conflicts:
            self.update(status="conflict")
            ships = self._ships_change(patchset, target)
            if ships is not None:
                raise PortConflict(
                    f"{len(conflicts)} hunk(s) of {variant.name} do not land in {self.request.release}, and "
                    f"{self.request.release} appears to ship the change itself: {ships}",
                    hint=f"review {self.report.superseded_candidate} and add it to patch.toml (docs/porting.md, "
                         "\"Moving to a new release\"); or resolve the markers to carry the patch anyway",
                )
            raise PortConflict(
                f"{len(conflicts)} hunk(s) of {variant.name} do not land exactly in {self.request.release}; "
                f"resolve the markers in {self.work.root / 'files'}, then run the same port command again",
                hint="nothing was written into the patch set",
            )
        return state

    def _ships_change(self, patchset: PatchSet, target: Target) -> str | None:
        """Hunks conflict: do the patch set's effect cases pass on the pristine release (the probe
        `_refuse_unguarded` ran)? Then the release appears to ship the change: say where it decides
        and what the probe sees differ, and write an unreviewed candidate `[[superseded]]` record
        beside the work folder. None when there are no effect cases or one of them fails."""
        probed = self.pristine_probe
        if probed is None or not patchset.effect_cases:
            return None
        by_name = {c.name: c for c in probed.cases}
        effects = [by_name.get(name) for name in patchset.effect_cases]
        if not all(c is not None and c.ok for c in effects):
            return None
        release, dist_name = self.request.release, patchset.distribution
        paths = sorted({w.split(":", 1)[0] for w in probed.where})
        files = {path: sha256(_pristine(target, path)) for path in paths}
        behaviour = tuple(f"{c.name}: {c.detail}" for c in effects if c is not None and "beyond" in c.detail)
        own = [c.name for c in probed.cases if not c.ok and c.name not in patchset.effect_cases]
        if own:   # the patch's own code is not in the release: one line, its groups named
            groups = ", ".join(dict.fromkeys(n.split(":", 1)[0] for n in own))
            behaviour += (f"{len(own)} cases of the patch's own code fail, as expected where it is not applied ({groups})",)
        name = f"superseded-{dist_name}-{release}"
        record = _candidate_record(f"{dist_name}-{release}", release, probed.where, files, f"{name}.md")
        path = self.work.write_beside(f"{name}.toml", record)
        self.work.write_beside(f"{name}.md", _candidate_review(patchset, release, effects, behaviour, probed.where))
        self.update(ships_change=probed.where, behaviour=behaviour, superseded_candidate=str(path))
        where = probed.where[0] if probed.where else "(the probe names no place)"
        return f"its {len(effects)} effect cases pass on the pristine release, decided at {where}"

    def _resolved(self, state: WorkState, pristine: dict[str, bytes]) -> dict[str, bytes]:
        """The work folder's files after a person's edits: each one checked for leftovers."""
        contents: dict[str, bytes] = {}
        left: list[str] = []
        reports = []
        for wf in state.files:
            if sha256(pristine[wf.path]) != wf.theirs_sha256:
                raise BadInput(f"{wf.path} of the given {self._what()} is not the file this work folder was merged onto",
                               hint="give the same release files as the first call, or another --work folder")
            data = self.work.read_file(wf.path)
            if data is None:
                raise BadInput(f"{self.work.root / 'files' / wf.path} is missing from the work folder",
                               hint="restore it, or start again in an empty --work folder")
            markers = leftover_markers(data)
            if markers:
                left.append(f"{wf.path}: line(s) {', '.join(map(str, markers[:8]))}{' …' if len(markers) > 8 else ''}")
            status: PortFileStatus = "conflict" if markers else ("resolved" if wf.status == "conflict" else "landed")
            reports.append(PortFileReport(path=wf.path, status=status, conflicts=wf.conflicts if markers else (),
                                          work_file=str(self.work.root / "files" / wf.path)))
            contents[wf.path] = data
        if not self.report.files:
            self.update(files=tuple(reports))
        if left:
            self.update(status="conflict", files=tuple(reports))
            raise PortConflict("conflict markers are left in the work folder: " + "; ".join(left),
                               hint="resolve them by hand, then run the same port command again")
        return contents

    def _check(self, target: Target, dist: Distribution, candidates: tuple[CandidateFile, ...],
               patchset: PatchSet) -> ProbeReport:
        plan = PatchPlan(status="apply", diff_sha256="", files=tuple(
            FilePlan(path=c.path, action="modify", pre=c.pre, post=c.post, pre_sha256=sha256(c.pre),
                     post_sha256=sha256(c.post), placements=()) for c in candidates))
        with _applied(target, plan):
            _compile(target, dist, [c.path for c in candidates if c.path.endswith(".py")])
            if patchset.probe is None:
                probed = ProbeReport(ok=True, ran=False, detail="this patch set has no probe")
            else:
                probed = run_probe(target, dist, patchset.probe, modules=patchset.probe_modules)
        self.update(probe=probed)
        if not probed.ok:
            readers = unguarded_readers(probed)
            self.update(unguarded=readers)
            raise ProbeFailed(f"the patch set's probe fails on {dist.name} {dist.version} with the candidate applied: "
                              f"{probed.detail}" + ("; unguarded: " + "; ".join(map(reader_line, readers)) if readers else ""),
                              hint="fix the files in the work folder and run port again; nothing was written into the patch set")
        return probed

    def _write(self, patchset: PatchSet, variant: Variant, state: WorkState,
               candidates: tuple[CandidateFile, ...], probed: ProbeReport) -> None:
        name = f"{patchset.distribution}-{self.request.release}"
        if any(v.name == name for v in patchset.variants):
            raise InvalidPatchSet(f"patch set {patchset.id} already has a variant named {name}")
        diff_name = f"{name}.patch"
        new_diff = make_diff(candidates)
        table = toml_table(name=name, release=self.request.release, diff_name=diff_name,
                           ported_from=variant.name, files=candidates)
        written = write_variant(patchset.source, diff_name=diff_name, diff=new_diff, table=table)
        try:
            reloaded = load_dir(patchset.source)
            new = next(v for v in reloaded.variants if v.name == name)
            if new.review != "unreviewed" or new.diff != new_diff:
                raise InvalidPatchSet(f"{patchset.source / 'patch.toml'}: the written variant {name} did not load back")
        except BaseException:
            undo_variant(written)
            raise
        forget_backup(written)
        if probed.census:
            ownfiles.write_file(patchset.source / f"census-{name}.json", census_json(probed.census))
        offsets = [f"`{f.path}`: " + ", ".join(f"hunk #{i} offset {o:+d}" for i, o in enumerate(f.offsets, 1))
                   for f in self.report.files if f.status == "landed" and f.offsets]
        resolved = [wf.path for wf in state.files if wf.status == "conflict"]
        text = review_md.render(review_md.ReviewInput(
            patch=patchset.id or "", source_variant=variant.name, source_releases=variant.releases, new_variant=name,
            release=self.request.release, source_diff=variant.diff, new_diff=new_diff, offsets=offsets, resolved=resolved,
            source_census=load_census(patchset.source / f"census-{variant.name}.json"), target_census=probed.census,
            probe=probed))
        review_path = self.work.write_review(text)
        ownfiles.write_file(patchset.source / f"{name}.review.md", text)
        self.update(status="written", exit_code=0, variant=name, diff_path=str(written.diff),
                    review_path=str(review_path))


# --- helpers --------------------------------------------------------------------------------

def reader_line(e: CensusEntry) -> str:
    return f"{e.file}:{e.line} {e.function} ({e.symbol}, {e.kind})"


def census_json(census: tuple[CensusEntry, ...]) -> str:
    rows = [{"file": e.file, "line": e.line, "function": e.function, "symbol": e.symbol, "kind": e.kind,
             "reached": e.reached, "none_safe": e.none_safe, "verdict": e.verdict} for e in census]
    return json.dumps({"schema": "dspark-patch/census/v1", "census": rows}, indent=1) + "\n"


def load_census(path: Path) -> tuple[CensusEntry, ...] | None:
    """A census recorded beside a variant when it was made (None: none was recorded), read bounded
    and never through a link (ownfiles.read_json): a patch set may come in a pull request."""
    try:
        doc = ownfiles.read_json(path, limit=16 << 20, what="census")
        return tuple(CensusEntry(**row) for row in doc["census"])
    except ownfiles.MissingFile:
        return None
    except (BadInput, ValueError, KeyError, TypeError) as exc:
        said = exc.message if isinstance(exc, BadInput) else f"{path}: not a recorded census ({exc})"
        raise InvalidPatchSet(said, hint="remove it, or record it again") from None


def _source_variant(patchset: PatchSet, name: str | None) -> Variant:
    if name is None:
        # The variant written by hand (not itself ported) is the one every port starts from.
        originals = [v for v in patchset.variants if v.ported_from is None]
        return (originals or list(patchset.variants))[-1]
    for v in patchset.variants:
        if v.name == name:
            return v
    raise BadInput(f"patch set {patchset.id} has no variant {name!r}; it has {', '.join(v.name for v in patchset.variants)}",
                   hint="--from names a variant of the patch set (dspark-patch show ID)")


def _parse(patchset: PatchSet, variant: Variant) -> Diff:
    diff = parse_diff(variant.diff, strip=patchset.strip)
    other = [f"{fp.path} ({fp.action})" for fp in diff.files if fp.action != "modify"]
    if other:
        raise BadInput(f"variant {variant.name} adds or deletes files ({', '.join(other)}); port carries changes to existing files only",
                       hint="port the other files by hand")
    return diff


def _planned(patchset: PatchSet, release: str, target: Target) -> PatchPlan:
    """An earlier member's variant for the release, planned at zero fuzz on the target's files (the
    members before it already applied), each file's reviewed hashes checked."""
    variant = patchset.variant_for(release)
    plan = plan_patch(parse_diff(variant.diff, strip=patchset.strip), target.read)
    if plan.status != "apply":
        raise BadInput(f"{patchset.id} {variant.name} is already applied to the given {release} files; a port starts "
                       "from the release's own files", hint="give the release's wheel (--wheel), or a pristine tree")
    for fp in plan.files:
        reviewed = variant.files.get(fp.path)
        if reviewed is None or (reviewed.pre_sha256, reviewed.post_sha256) != (fp.pre_sha256, fp.post_sha256):
            raise BadInput(f"{patchset.id} {variant.name}: {fp.path} is not its reviewed pre/post image on these files, "
                           "so the sets after it cannot be ported onto its result",
                           hint="port the series from a pristine release, in the order its requires give")
    return plan


def _pristine(target: Target, path: str) -> bytes:
    data = target.read(path)
    if data is None:
        raise TargetNotFound(f"{path}: the variant changes this file, but the target release has no such file",
                             hint="this release is laid out differently; a port needs a person here (docs/porting.md)")
    return data


@contextmanager
def _applied(target: Target, plan: PatchPlan) -> Iterator[None]:
    target.write(plan)
    try:
        yield
    finally:
        target.restore(plan)


def _compile(target: Target, dist: Distribution, paths: list[str]) -> None:
    if not paths:
        return
    rows = compiled_rows(target, dist, paths)
    bad = [(p, row.detail) for p, row in zip(paths, rows, strict=True) if not row.ok]
    if bad:
        raise CompileFailed(
            "; ".join(f"{p} does not compile with {dist.python} ({dist.python_version}): {d}" for p, d in bad),
            hint="fix the file in the work folder and run port again; nothing was written into the patch set",
        )


def _candidate_record(name: str, release: str, where: tuple[str, ...], files: Mapping[str, str | None],
                      review_file: str) -> str:
    """An unreviewed `[[superseded]]` table for patch.toml (TOML basic strings are JSON's)."""
    q = json.dumps
    lines = ["# Written by `dspark-patch port`: the effect cases pass on the pristine release. A person",
             "# reads the review note, writes `upstream` in their own words, copies the note beside",
             "# patch.toml, sets review = \"reviewed\" and adds this table to patch.toml.",
             "[[superseded]]", f"name = {q(name)}", f"releases = [{q(release)}]",
             f"upstream = {q('TO WRITE: what ' + release + ' does instead, in one line')}",
             "where = [" + ", ".join(q(w) for w in where) + "]",
             'review = "unreviewed"', f"review_file = {q(review_file)}", "", "[superseded.files]"]
    lines += [f"{q(path)} = {q(digest)}" for path, digest in files.items() if digest is not None]
    return "\n".join(lines) + "\n"


def _candidate_review(patchset: PatchSet, release: str, effects: list, behaviour: tuple[str, ...],
                      where: tuple[str, ...]) -> str:
    out = [f"# Review: {patchset.id} appears superseded by {patchset.distribution} {release}", "",
           f"`dspark-patch port` could not merge the patch onto {release}, and the patch set's effect cases",
           "pass on the pristine release. The candidate record beside this note is **unreviewed**.", "",
           "## Where the release decides", "", *[f"- `{w}`" for w in where], "",
           "## The effect cases on the pristine release", "", "| case | result | detail |", "|---|---|---|",
           *[f"| {c.name} | {'ok' if c.ok else 'FAILED'} | {c.detail.replace('|', '/')} |" for c in effects if c is not None],
           "", "## What the probe sees differ from the patch", "",
           *([f"- {b}" for b in behaviour] or ["- nothing"]), "",
           "## For the reviewer", "",
           "State upstream's scope against the patch's reviewed scope (see vllm-0.34.0.superseded.md for the",
           "shipped example): where the release skips more or less than the patch did, and why that is safe.", ""]
    return "\n".join(out)
