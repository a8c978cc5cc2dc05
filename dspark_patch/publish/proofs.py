"""What `publish` proves before it writes anything: that the report was made from the source
image's tree, and that the layer holds exactly what that run made of it.

The source is read as `status --via registry` reads it (the strict layer reader, the scan cache,
the site folder the image's interpreters import), and so is the image the layer would make: the
source's layers with the new one on top, merged the engine's way. Then:
- the source: vLLM at the report's site folder and release, the report's interpreter there, each
  file its reported (reviewed) pre-image, the patch sets absent, nothing unexplained against the
  published wheel (status's own rows, no finding);
- the layer: its sha256 and size the report's, read with the strict reader, exactly the report's
  changes (recounted against the source: added, changed, deleted), nothing outside the patched
  files, their bytecode and the folders above them;
- the headers: each entry's PAX records, mode and owner what `apply --image` of the source would
  write (publish/headers.py);
- the bytecode: each .pyc the layer holds is checked-hash bytecode of the image's Python (its
  magic number) whose embedded source hash is the patched source's (computed here with that
  magic number's key), and its code is recompiled by an interpreter of the image's minor (this
  host's, `python3.X` on PATH or --python) and compared (status/bytecode.py); with no such
  interpreter, a layer with bytecode is refused;
- the result: status's row of the image-to-be has every patch set applied, each file its
  post-image, and no finding.
Each failure is one PublishRefused line; nothing has been written when they run.
"""

from __future__ import annotations

import _imp
import hashlib
import io
import tarfile
from collections.abc import Sequence

from ..errors import BadInput, CheckFailed
from ..references import bytecode_source
from ..report.status_model import ImageStatus
from ..status.bytecode import cache_tag, compare, interpreter_for, minor_magic
from ..targets.layers import LayerView
from ..targets.layers.new_layer import LayerEntry, layer_entries
from ..targets.views.site_files import SiteFiles
from .claim import Claim, refuse


def _first_finding(row: ImageStatus) -> str:
    return (row.unexplained or row.missing or row.added or row.record_disagrees or row.bytecode
            or row.unimported or row.installer_findings or ("no published wheel to check it against",))[0]


def prove_source(claim: Claim, view: LayerView, site: SiteFiles, row: ImageStatus, src: str) -> None:
    where = f"the report ({claim.report.target.ref})"
    if site.location != claim.location:
        raise refuse(f"{where} was made at {claim.location}, but the python of {src} imports vLLM from {site.location}",
                     hint="publish the layer onto the image the in-image run ran in")
    if site.release != claim.release:
        raise refuse(f"{where} is for vLLM {claim.release}, but {src} holds vLLM {site.release}",
                     hint="publish onto the image of that release, or run the in-image job in this one")
    python = view.get(view.resolve(claim.python))
    if python is None or python.kind != "file" or (site.python and site.python != claim.python_minor):
        raise refuse(f"{where} was made by {claim.python} (Python {claim.python_minor}), which {src} does not have "
                     f"(its vLLM is imported by Python {site.python or '?'})",
                     hint="publish the layer onto the image the in-image run ran in")
    for path, (pre, _) in sorted(claim.files.items()):
        if site.hashes.get(path) != pre:
            raise refuse(f"{path} in {src} is not the pre-image the report was made from "
                         f"({(site.hashes.get(path) or 'absent')[:12]} there, {(pre or 'absent')[:12]} in the report)",
                         hint="publish the layer onto the image the in-image run ran in")
    states = dict(row.patch_sets)
    for patchset, _ in claim.members:
        if states.get(patchset.id or "") != "absent":
            raise refuse(f"{patchset.id} is {states.get(patchset.id or '', 'not known')} in {src}, not absent",
                         hint="publish onto the image without the patch (an image that carries it needs no layer)")
    if row.findings:
        raise refuse(f"{src} is not its release as published (e.g. {_first_finding(row)})",
                     hint=f"run `dspark-patch status --via registry --image {src}`; publish onto a clean image")


def prove_layer(claim: Claim, layer: bytes, view: LayerView) -> tuple[LayerEntry, ...]:
    """The layer's entries, once they are exactly what the report's run wrote."""
    digest = "sha256:" + hashlib.sha256(layer).hexdigest()
    if digest != claim.diff_id or len(layer) != claim.size:
        raise refuse(f"the layer is {digest[:19]}…, {len(layer)} bytes, but the report's is {claim.diff_id[:19]}…, "
                     f"{claim.size} bytes", hint="publish the layer file the same in-image run wrote beside its report")
    try:
        entries = layer_entries(layer)
    except CheckFailed as exc:   # the strict reader's refusal of the job's tar: bad input here
        raise refuse(f"the layer is not one apply writes: {exc.message}") from None
    changes = [(e.path, "D" if e.deleted else "A" if not e.folder and view.get(e.path.lstrip("/")) is None else "C")
               for e in entries]
    said = [(c.path, c.kind) for c in claim.report.layer.changes] if claim.report.layer else []
    if changes != said:
        odd = sorted(set(changes) ^ set(said)) or changes
        raise refuse(f"the layer's entries are not the report's changes against the source (first: {odd[0][1]} {odd[0][0]})",
                     hint="publish the layer file the same in-image run wrote, onto the image it ran in")
    allowed, pycs = _expected(claim)
    for entry in entries:
        if entry.path not in allowed:
            raise refuse(f"the layer holds {entry.path}, which is none of the patched files, their bytecode or the "
                         "folders above them", hint="publish the layer the in-image run wrote, unchanged")
        rel = entry.path[len(claim.location) + 1:]
        if rel in claim.files:
            post = claim.files[rel][1]
            if entry.deleted != (post is None) or (post is not None and entry.sha256 != post):
                raise refuse(f"{entry.path} in the layer is not its reviewed post-image",
                             hint="publish the layer the in-image run wrote, unchanged")
    held = {e.path for e in entries if not e.folder and not e.deleted}
    missing = sorted(p for p in [*(f"{claim.location}/{r}" for r, (_, post) in claim.files.items() if post), *pycs]
                     if p not in held)
    if missing:
        raise refuse(f"the layer lacks {missing[0]}", hint="publish the layer the in-image run wrote, unchanged")
    return entries


def _expected(claim: Claim) -> tuple[set[str], list[str]]:
    """Every path the layer may hold, and the bytecode it must hold (of each patched module kept)."""
    allowed: set[str] = set()
    pycs = []
    for rel, (_, post) in claim.files.items():
        full = f"{claim.location}/{rel}"
        allowed.add(full)
        if rel.endswith(".py"):
            folder, _, name = full.rpartition("/")
            allowed.add(f"{folder}/__pycache__")
            pyc = f"{folder}/__pycache__/{name[:-3]}.{cache_tag(claim.python_minor)}.pyc"
            allowed.add(pyc)
            if post is not None:
                pycs.append(pyc)
        parts = full.split("/")
        allowed.update("/".join(parts[:i]) for i in range(2, len(parts)))
    return allowed, pycs


def prove_bytecode(claim: Claim, layer: bytes, entries: Sequence[LayerEntry], python: str | None) -> int:
    """Each .pyc in the layer: the image's Python's checked-hash bytecode of the patched source
    beside it (by the source hash in its header), and its code what an interpreter of the image's
    minor compiles from that source (recompiled here and compared; a header is not a proof).
    `python`: the user's --python. Returns how many were proven."""
    magic = minor_magic(claim.python_minor)
    if magic is None:
        raise refuse(f"the report's Python {claim.python_minor} is not one whose bytecode this dspark-patch knows",
                     hint="publish with a dspark-patch that knows it")
    files = {e.path for e in entries if not e.folder and not e.deleted}
    pycs = sorted(p for p in files if p.endswith(".pyc"))
    if not pycs:
        return 0   # uv's shape with no bytecode written: nothing to recompile
    interpreter = interpreter_for(magic, claim.python_minor, python)
    if interpreter is None:
        if python is not None:
            raise BadInput(f"--python {python} is not an interpreter of Python {claim.python_minor} (the image's)",
                           hint=f"name a python{claim.python_minor} that runs on this host")
        raise refuse(f"the layer holds Python {claim.python_minor} bytecode, and this host has no Python "
                     f"{claim.python_minor} to recompile it (its header alone proves nothing)",
                     hint=f"name one with --python PATH, or publish from a host with python{claim.python_minor}")
    items = []
    with tarfile.open(fileobj=io.BytesIO(layer), mode="r:") as tar:   # the strict reader has read it already
        def body(path: str) -> bytes:
            member = tar.extractfile(path.lstrip("/"))
            assert member is not None
            return member.read()

        for path in pycs:
            source = bytecode_source(path)   # the layer's .pyc are those of patched modules (prove_layer)
            pyc = body(path)
            flags = int.from_bytes(pyc[4:8], "little") if len(pyc) >= 16 else -1
            if pyc[:4] != magic or not flags & 0b1 or ".opt-" in path.rpartition("/")[2]:
                raise refuse(f"{path} in the layer is not checked-hash bytecode of Python {claim.python_minor}",
                             hint="publish the layer the in-image run wrote, unchanged")
            if source is None or source not in files or pyc[8:16] != _imp.source_hash(int.from_bytes(magic, "little"), body(source)):
                raise refuse(f"{path} in the layer embeds the hash of another source than {source}",
                             hint="publish the layer the in-image run wrote, unchanged")
            items.append({"source": body(source), "pyc": pyc, "filename": source, "opt": 0, "checked": bool(flags & 0b10)})
    for path, why in zip(pycs, compare(items, interpreter), strict=True):
        if why:
            raise refuse(f"{path} in the layer is not its source's code as Python {claim.python_minor} compiles it "
                         f"(recompiled here and compared: {why})", hint="publish the layer the in-image run wrote, unchanged")
    return len(pycs)


def prove_result(claim: Claim, site: SiteFiles, row: ImageStatus, dest: str) -> None:
    if site.location != claim.location:
        raise refuse(f"with the layer, {dest}'s python would import vLLM from {site.location}, not {claim.location}")
    for path, (_, post) in sorted(claim.files.items()):
        if site.hashes.get(path) != post:
            raise refuse(f"with the layer, {path} would not be its reviewed post-image")
    states = dict(row.patch_sets)
    for patchset, _ in claim.members:
        if states.get(patchset.id or "") != "applied":
            raise refuse(f"with the layer, {patchset.id} would be {states.get(patchset.id or '', 'not known')}, not applied")
    if row.findings:
        raise refuse(f"with the layer, {dest} would not be its release plus the patch (e.g. {_first_finding(row)})",
                     hint="publish the layer the in-image run wrote, unchanged")
