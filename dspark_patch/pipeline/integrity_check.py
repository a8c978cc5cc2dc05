"""The integrity check, on any target: the installed distribution against the published wheel
(its files, its RECORD, start-up hooks and `.pth` files, every `.pyc` the interpreter would load
recompiled and compared). The facts are gathered by the target's own interpreter
(inside/integrity.py), an image's answer kept by image id (targets/caches/answers.py); the verdict is
taken here. `verify` reports what it finds; `apply` refuses a tree that is not the wheel before
it writes anything (`check_base`)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any

from .. import references
from ..errors import ModifiedBase, VerifyMismatch
from ..inside import source as inside_source
from ..inside.answers import IntegrityAnswer, MalformedAnswer, decode_integrity, encode_integrity
from ..inside.integrity import own_folders
from ..patching.diff import Diff
from ..patchset import Variant
from ..report.model import IntegrityReport
from ..targets.base import Distribution, HashesFiles, ImageCapable, Target
from ..targets.caches import answers, proofs
from .policy import CheckPolicy
from .runlog import RunLog
from .shared_steps import cached_name


def check_integrity(target: Target, dist: Distribution, diff: Diff, variant: Variant | None = None,
                    *, pre_image: bool = False) -> IntegrityReport:
    """The distribution against the published wheel (dspark_patch.references), its own RECORD
    against the same, and every .pyc its interpreter would load recompiled and compared
    (inside/integrity.py). The facts are gathered by the target's interpreter, run isolated;
    the verdict is taken here. `pre_image`: the tree before apply writes anything; the files
    the diff changes hold the wheel's own bytes (or, already applied, the post-image) and their
    bytecode is pip's, so it is held to the rule of every other module, not to the tool's."""
    patched = {fp.path for fp in diff.files}
    py_files = [] if pre_image else \
        sorted(fp.path for fp in diff.files if fp.action != "delete" and fp.path.endswith(".py"))
    record = [(e.path, e.sha256) for e in dist.record]
    top = dist.name.replace("-", "_").lower()
    folders = own_folders(p for p, _ in record) | {top}
    folders |= references.folders_of(dist.name, dist.version)
    rows = references.script_rows(record, references.all_scripts(dist.name))
    request = {"location": dist.location, "folders": sorted(folders), "patched": py_files, "scripts": list(rows)}
    answer, files, kept_answer = _integrity_answer(target, dist, request)
    pth, bytecode, metadata = answer.pth, answer.bytecode, answer.metadata
    reused = 0 if kept_answer else answer.proofs_reused
    scripts = {k: v for k, v in answer.scripts.items() if k in rows}
    stale = tuple(f"{pyc} {why}" for pyc, why in sorted(bytecode.items()) if why)
    post: dict[str, set[str | None]] = {}
    if variant is not None:
        post = {path: {expected.post_sha256} for path, expected in variant.files.items()}
    wheel = references.wheel_hash(dist.name, dist.version, files)
    ref = references.find(dist.name, dist.version, wheel)
    if ref is None:
        not_checked = tuple(p for p, _ in record if p.startswith(("/", "../")) or "/../" in p)
        return IntegrityReport(checked=0, not_checked=not_checked, stale_bytecode=stale, reference=None,
                               unverified=(references.no_reference(dist.name, dist.version, wheel),),
                               bytecode_checked=len(bytecode), bytecode_proofs_reused=reused, kept_answer=kept_answer)
    found = references.compare(ref, hashes=files, others=answer.others, record=record, post_images=post,
                               top_level=answer.top_level, pth=pth, listed_anywhere=answer.pth_listed,
                               metadata=metadata, scripts=scripts)
    tag = answer.cache_tag
    without = sum(1 for p in files if p.endswith(".py") and cached_name(p, tag) not in files)
    # Rows outside the tree that were not read: a console script's row with no file there.
    not_checked = tuple(p for p in rows if p not in found.installer and scripts.get(p, b"") is None)
    return IntegrityReport(
        checked=found.checked, mismatched=tuple(p for p in found.unexplained if p not in patched),
        missing=tuple(p for p in found.missing if p not in patched), not_checked=not_checked, stale_bytecode=stale,
        added=found.added, reference=ref.wheel, record_disagrees=found.record_disagrees, bytecode_checked=len(bytecode),
        bytecode_proofs_reused=reused, kept_answer=kept_answer, installer_metadata=found.installer,
        installer_findings=found.installer_findings, modules_without_bytecode=without)


def _integrity_answer(target: Target, dist: Distribution,
                      request: dict[str, Any]) -> tuple[IntegrityAnswer, dict[str, str], bool]:
    """inside/integrity.py's answer for `request`, the files' sha256, and whether it is an
    image's answer kept by its id from an earlier check (targets/caches/answers.py says why that is as
    good as asking again; one that does not decode is a miss).

    The proofs sent (kept from an earlier check by the same interpreter; inside/integrity.py
    says why a kept proof is as good as a compile, targets/caches/proofs.py where they are kept) only
    spare compiles, and who hashed (the walk or the host, `_gathered`) does not change a
    hash, so neither is part of the key."""
    key = target.answer_key(inside_source("integrity"), [request]) if isinstance(target, ImageCapable) else None
    held = _kept(answers.get(key)) if key else None
    if held is not None:
        return *held, True
    answer, files = _gathered(target, dist, {**request, "proofs": proofs.to_send(target.info, dist)})
    proofs.put(target.info, dist, answer)
    if key:
        answers.put(key, encode_integrity(replace(answer, identity=None, proofs=None,
                                                files={p: (files[p], answer.files[p][1]) for p in files})))
    return answer, files, False


def _kept(doc: Any) -> tuple[IntegrityAnswer, dict[str, str]] | None:
    """A kept answer that decodes and names every file's sha256, with those; else None (a miss)."""
    try:
        answer = decode_integrity(doc)
    except MalformedAnswer:
        return None
    files = _hashes(answer)
    return None if files is None else (answer, files)


def _hashes(answer: IntegrityAnswer) -> dict[str, str] | None:
    """Every file's sha256 as the walk hashed it; None when it left one to the host."""
    hashes = {p: sha for p, (sha, _) in answer.files.items() if sha is not None}
    return hashes if len(hashes) == len(answer.files) else None


def _gathered(target: Target, dist: Distribution, request: dict) -> tuple[IntegrityAnswer, dict[str, str]]:
    """inside/integrity.py's answer and the files' sha256. On a target that can and runs
    emulated (an image of another architecture: its engine streams the same bytes,
    targets/docker/tree_hashes.py), the host hashes the files
    while the target's python walks them, and takes those hashes only if its archive holds
    exactly the regular files the walk found, each of the size the walk saw; otherwise the walk
    runs again and hashes them itself."""
    native = target if isinstance(target, HashesFiles) and target.emulated else None
    if native is None:
        return _hashed_walk(target, dist, request)
    with ThreadPoolExecutor(max_workers=1) as pool:
        hashing = pool.submit(native.file_hashes, dist.location, request["folders"])
        doc = _run_integrity(target, dist, {**request, "hash": False})
        try:
            hashed = hashing.result()
        except Exception:  # noqa: BLE001 - a stream the engine dropped: the walk hashes instead
            hashed = None
    try:
        answer: IntegrityAnswer | None = decode_integrity(doc)
    except MalformedAnswer as exc:
        if exc.field != "files":
            raise _without(dist, exc) from None
        answer = None  # a walk without its files: it runs again and hashes them itself
    if hashed is not None and answer is not None and answer.files.keys() == hashed.keys() \
            and all(hashed[p][1] == size for p, (_, size) in answer.files.items()):
        return answer, {p: hashed[p][0] for p in answer.files}
    return _hashed_walk(target, dist, request)


def _hashed_walk(target: Target, dist: Distribution, request: dict) -> tuple[IntegrityAnswer, dict[str, str]]:
    """The walk's answer with every file hashed by the walk itself."""
    try:
        answer = decode_integrity(_run_integrity(target, dist, request))
    except MalformedAnswer as exc:
        raise _without(dist, exc) from None
    files = _hashes(answer)
    if files is None:
        raise _without(dist, MalformedAnswer("integrity.py", "files", "holds a file without its sha256"))
    return answer, files


def _without(dist: Distribution, exc: MalformedAnswer) -> VerifyMismatch:
    """What a user reads of an integrity answer that is not one (exc names the field at fault)."""
    return VerifyMismatch(f"the integrity check with {dist.python} answered without its "
                          f"{'files' if exc.field == 'files' else 'facts'}")


def _run_integrity(target: Target, dist: Distribution, request: dict) -> dict:
    result = target.run_python(inside_source("integrity"), [json.dumps(request)], timeout=900)
    try:
        doc = json.loads(result.stdout.decode("utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        return doc
    except ValueError:
        raise VerifyMismatch(
            f"the integrity check could not run with {dist.python}: {result.stderr.decode('utf-8', 'replace').strip()[-300:]}"
        ) from None


def integrity_problems(i: IntegrityReport) -> list[str]:
    """What a check against the published wheel found, one line each (verify's and apply's)."""
    return [*(f"{p}: does not match the published wheel" for p in i.mismatched),
            *(f"{p}: missing (the published wheel has it)" for p in i.missing),
            *(f"{p}: added (not in the published wheel)" for p in i.added),
            *(f"{p}: the RECORD row disagrees with the published wheel" for p in i.record_disagrees),
            *i.installer_findings, *i.stale_bytecode]


def check_base(run: RunLog, target: Target, dist: Distribution, diff: Diff, variant: Variant | None,
               policy: CheckPolicy) -> None:
    """apply, before anything is written: the tree must be the published wheel, checked as
    verify checks it (every file against the shipped reference, the RECORD against the same,
    every .pyc the interpreter would load recompiled and compared). The pre-image hashes of the
    patched files say nothing of the others: an edited `vllm/__init__.py` with its RECORD row
    rewritten, an added `.pth` or `sitecustomize.py`, forged bytecode would all be patched and
    then carry the reviewed patch's labels. The early probe warms up meanwhile (EarlyStart).

    A bare diff (no release named) or `--allow-unknown-base` (the policy's `base_waiver`): the
    findings are notes and the tree is patched; a release with no reference: a note (nothing to check against)."""
    with run.step("integrity"):
        i = check_integrity(target, dist, diff, None if variant is None else policy.checked_variant(variant),
                            pre_image=True)
        if i.reference is None:
            run.notes.extend(f"{u}; patched on the reviewed pre-image hashes alone" for u in i.unverified)
            return
        problems = integrity_problems(i)
        why = policy.base_waiver
        if why is not None:
            if problems:
                more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
                run.notes.append(f"{why}: the tree is not the published wheel {i.reference}, patched anyway: "
                                 + "; ".join(problems[:3]) + more)
            return
        run.update(integrity=i)
        if problems:
            more = f" (and {len(problems) - 3} more; see the report)" if len(problems) > 3 else ""
            raise ModifiedBase(
                f"{run.draft.target.ref} is not the published wheel {i.reference}: " + "; ".join(problems[:3]) + more
                + "; nothing was written",
                hint="apply to a pristine vLLM install, or rebuild the image from the release; "
                "--allow-unknown-base patches it anyway, and the report says so",
            )
