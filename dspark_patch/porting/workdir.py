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
import os
from dataclasses import dataclass
from pathlib import Path

from ..errors import BadInput
from ..targets import fs

STATE_SCHEMA = "dspark-patch/port/v1"


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
        if root.exists() and not root.is_dir():
            raise BadInput(f"--work {root}: is not a folder", hint="give a folder for the port's work files")

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
            doc = json.loads(self.state_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError) as exc:
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
        self.root.mkdir(parents=True, exist_ok=True)
        for rel, data in contents.items():
            path = self.root / "files" / rel
            fs.resolve_inside(self.root, f"files/{rel}")  # refuses '..' and links out of the folder
            path.parent.mkdir(parents=True, exist_ok=True)
            _atomic(path, data)
        doc = {"schema": STATE_SCHEMA, "patch": state.patch, "source_variant": state.source_variant,
               "release": state.release,
               "files": [{"path": f.path, "status": f.status, "theirs_sha256": f.theirs_sha256,
                          "conflicts": list(f.conflicts)} for f in state.files]}
        _atomic(self.state_path, (json.dumps(doc, indent=2) + "\n").encode("utf-8"))

    def read_file(self, rel: str) -> bytes | None:
        return fs.read_inside(self.root / "files", rel) if (self.root / "files").is_dir() else None

    def write_review(self, text: str) -> Path:
        _atomic(self.review_path, text.encode("utf-8"))
        return self.review_path


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".dspark-tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
