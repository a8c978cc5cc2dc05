"""`dspark-patch reference add WHEEL | NAME==RELEASE`: a release's reference into the user's folder;
`reference list`: every reference a lookup reads, and where each comes from.

The reference is made by the builder the shipped ones come from (references/build.py: the
wheel's RECORD cross-checked against the bytes in the zip), read back through the loader every
lookup uses (references/document.py) before it is kept, and written atomically into the user's
folder (references/user.py). With NAME==RELEASE the wheel is fetched the way pip fetches it
(references/fetch.py: `pip download --no-deps`, the index's hash checked by pip). A shipped
reference of the same wheel wins: one that differs from it is a finding (exit 1), nothing written.
"""

from __future__ import annotations

import csv
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from ..distname import filename_name
from ..errors import BadInput, CheckFailed, DsparkPatchError, TargetNotFound
from ..references import build, document, entries, shadowed, user
from ..references.fetch import fetched_wheel, parse_spec

Outcome = Literal["written", "replaced", "unchanged", "shipped"]


@dataclass(frozen=True, kw_only=True)
class AddRequest:
    wheel: str | None = None      # a wheel file, or
    spec: str | None = None       # NAME==RELEASE, fetched with pip
    platform: str | None = None   # with spec: pip's --platform


@dataclass(frozen=True, kw_only=True)
class Added:
    outcome: Outcome
    name: str                     # the reference's file name
    path: str                     # where it is (the user's file, or the shipped one's place)
    wheel: str                    # the wheel's file name
    files: int
    fetched: bool


def add(request: AddRequest) -> Added:
    if (request.wheel is None) == (request.spec is None):
        raise BadInput("reference add takes a wheel file or NAME==RELEASE", hint="e.g. dspark-patch reference add vllm==0.34.0")
    if request.platform is not None and request.spec is None:
        raise BadInput("--platform picks the wheel pip downloads; a wheel file names its own platform",
                       hint="drop --platform, or give NAME==RELEASE")
    if request.spec is None:
        wheel = Path(request.wheel or "")
        if not wheel.is_file():
            raise TargetNotFound(f"{wheel}: no such wheel file", hint="give a .whl file, or NAME==RELEASE to fetch it")
        return _keep(_built(wheel), fetched=False)
    name, release = parse_spec(request.spec)
    with fetched_wheel(name, release, request.platform) as fetched:
        doc = _built(fetched)
    if (doc["distribution"], doc["release"]) != (filename_name(name), release):
        raise CheckFailed(f"pip gave {doc['wheel']} for {request.spec}", hint="give the wheel file yourself")
    return _keep(doc, fetched=True)


def _built(wheel: Path) -> dict:
    if not wheel.name.endswith(".whl") or len(wheel.name.removesuffix(".whl").split("-")) not in (5, 6):
        raise BadInput(f"{wheel}: its name is not a wheel's (<name>-<release>-<python>-<abi>-<platform>.whl)",
                       hint="give the published wheel under its own name")
    try:
        doc = build.reference_from_wheel(wheel)
    except build.WheelDisagrees as exc:
        raise BadInput(f"{wheel}: its RECORD does not match its files ({exc}); no reference is made from it",
                       hint="use the published wheel") from None
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError, csv.Error, KeyError, ValueError) as exc:
        raise BadInput(f"{wheel}: not a wheel a reference can be made from ({type(exc).__name__}: {str(exc)[:200]})",
                       hint="give the published .whl file") from None
    return doc


def _keep(doc: dict, *, fetched: bool) -> Added:
    data = build.encode(doc)
    name = build.file_name(doc)
    try:  # what a lookup will read: the same checks, before anything is written
        document.decode(data, name)
    except document.Invalid as exc:
        raise BadInput(f"{doc['wheel']}: its reference would not load ({exc})",
                       hint="its file name must be the wheel's own (<name>-<release>-<tags>.whl)") from None
    shipped = resources.files("dspark_patch.references").joinpath(name)
    common = {"name": name, "wheel": doc["wheel"], "files": len(doc["files"]), "fetched": fetched}
    if shipped.is_file():
        if shipped.read_bytes() != data:
            raise CheckFailed(f"{doc['wheel']} is not the wheel the shipped reference {name} was made from "
                              "(their files differ); the shipped one is used, nothing was written",
                              hint="check where this wheel came from")
        return Added(outcome="shipped", path=str(shipped), **common)
    outcome: Outcome = "written"
    if name in user.names():
        try:
            before = user.read(name)
        except BadInput:
            before = None   # a link or other odd entry: the write below refuses it, naming it
        if before == data:
            return Added(outcome="unchanged", path=str(user.folder() / name), **common)
        outcome = "replaced"
    return Added(outcome=outcome, path=str(user.store(name, data)), **common)


@dataclass(frozen=True, kw_only=True)
class Listed:
    name: str
    origin: Literal["shipped", "user"]
    path: str
    wheel: str | None = None
    files: int | None = None
    error: DsparkPatchError | None = None   # a user file that does not load: shown, never skipped


@dataclass(frozen=True, kw_only=True)
class Listing:
    user_folder: str
    references: tuple[Listed, ...]
    shadowed: tuple[tuple[str, str, bool], ...]   # (name, user file, whether it differs from the shipped one)


def listing() -> Listing:
    """Every reference, loaded and checked as a lookup loads it (references.entries)."""
    rows = []
    for entry in entries():
        try:
            ref = entry.load()
        except DsparkPatchError as exc:
            rows.append(Listed(name=entry.name, origin=entry.origin, path=entry.where, error=exc))
            continue
        rows.append(Listed(name=entry.name, origin=entry.origin, path=entry.where, wheel=ref.wheel, files=len(ref.files)))
    return Listing(user_folder=str(user.folder()), references=tuple(rows),
                   shadowed=tuple((e.name, e.where, differs) for e, differs in shadowed()))
