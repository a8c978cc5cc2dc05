"""The port's work folder: what a first call left for a person, and what a second call re-checks.

    WORK/port.json          which patch set, source variant and release; each file's state and
                            the sha256 of the target's pristine file it was merged onto
    WORK/files/<path>       the candidate post-image (landed), or the merge with markers (conflict)
    WORK/tree/              for --wheel/--root: a scratch copy of the release's sources and
                            dist-info, where the candidate is compiled and probed (never the
                            user's own tree)
    WORK/REVIEW.md          written with the variant: what a reviewer reads
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .. import ownfiles
from ..errors import BadInput, EnvironmentProblem
from ..targets import fs

STATE_SCHEMA = "dspark-patch/port/v1"
_STATE_LIMIT = 4 << 20


@dataclass(frozen=True, kw_only=True)
class WorkFile:
    path: str
    status: str              # "landed" or "conflict" when the merge wrote it
    theirs_sha256: str       # the target's pristine file it was merged onto
    conflicts: tuple[str, ...] = ()


@dataclass(frozen=True, kw_only=True)
class WorkState:
    patch: str
    source_variant: str
    release: str
    files: tuple[WorkFile, ...]


class WorkDir:
    def __init__(self, root: Path) -> None:
        self.root = root
        # A committed link named like the work folder (or above it) would take every write and
        # the scratch tree's removal outside: refused here, before any work.
        ownfiles.check_folder(root)

    @property
    def state_path(self) -> Path:
        return self.root / "port.json"

    @property
    def tree(self) -> Path:
        return self.root / "tree"

    @property
    def review_path(self) -> Path:
        return self.root / "REVIEW.md"

    def load(self) -> WorkState | None:
        try:
            with ownfiles.open_folder(self.root, create=False) as folder:
                raw = folder.read("port.json", limit=_STATE_LIMIT)
        except ownfiles.MissingFolder:
            return None
        if raw is None:
            return None
        try:
            doc = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise BadInput(f"{self.state_path}: not a port state file ({exc})",
                           hint="use an empty --work folder, or the one a previous port call made") from None
        try:
            if doc["schema"] != STATE_SCHEMA:
                raise ValueError(f"schema {doc['schema']!r}")
            files = tuple(WorkFile(path=str(f["path"]), status=str(f["status"]), theirs_sha256=str(f["theirs_sha256"]),
                                   conflicts=tuple(str(c) for c in f["conflicts"])) for f in doc["files"])
            return WorkState(patch=str(doc["patch"]), source_variant=str(doc["source_variant"]),
                             release=str(doc["release"]), files=files)
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"{self.state_path}: not a port state file ({exc})",
                           hint="use an empty --work folder, or the one a previous port call made") from None

    def save(self, state: WorkState, contents: dict[str, bytes]) -> None:
        """Write each file's merge result and then the state (the state last: it marks a whole write)."""
        try:
            with ownfiles.open_folder(self.root) as root:
                for rel, data in contents.items():
                    fs.check_relative(rel)  # refuses '..', absolute paths and NUL
                    *dirs, name = rel.split("/")
                    _write_below(root, ["files", *dirs], name, data)
                root.write("port.json", _state_json(state))
        except OSError as exc:
            raise EnvironmentProblem(f"cannot write the work folder {self.root}: {exc.strerror or exc}",
                                     hint="give a writable --work folder") from None

    def read_file(self, rel: str) -> bytes | None:
        return fs.read_inside(self.root / "files", rel) if (self.root / "files").is_dir() else None

    def write_review(self, text: str) -> Path:
        return ownfiles.write_file(self.review_path, text)

    def write_beside(self, name: str, text: str) -> Path:
        """A file of the work folder's own (a candidate record), never through a link."""
        self.root.mkdir(parents=True, exist_ok=True)
        return ownfiles.write_file(self.root / name, text)


def _write_below(folder: ownfiles.Folder, dirs: list[str], name: str, data: bytes) -> None:
    if not dirs:
        folder.write(name, data)
        return
    with folder.sub(dirs[0]) as sub:
        _write_below(sub, dirs[1:], name, data)


def _state_json(state: WorkState) -> bytes:
    doc = {"schema": STATE_SCHEMA, "patch": state.patch, "source_variant": state.source_variant,
           "release": state.release,
           "files": [{"path": f.path, "status": f.status, "theirs_sha256": f.theirs_sha256,
                      "conflicts": list(f.conflicts)} for f in state.files]}
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")
