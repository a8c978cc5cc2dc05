"""The record that a patch set's probe passed on a local tree: `.dspark-patch-probed.json`.

`apply --root` tells an already-applied tree by its files alone, and the files cannot say whether
the probe ever passed on them: a tree left by a run killed before its probe reads the same as one
a whole run finished. So a whole run whose probe passed keeps this record in the site folder,
beside its journal (targets/journal.py), naming exactly what passed: the distribution, the diff,
the post-image of every file it changes (path and sha256), the probe source that ran (its sha256)
and the interpreter (path, version, cache tag). A later apply that finds the tree already applied
accepts it without compiling and probing again only when the record equals, field by field, the
one it would write itself; anything else (no record, another interpreter, a changed probe, a
malformed or linked file) is no record, and the tree is compiled and probed before OK. A run that
starts writing removes the record first.

Only runs with hash checks on keep one: the rest of the tree was checked against the published
wheel, so the post-images and the interpreter are all the probe's verdict depends on. The record
is not a secret and not signed: whoever can write it can write the tree's files too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from .. import ownfiles
from ..errors import BadInput, EnvironmentProblem

SCHEMA = "dspark-patch/probed/v1"
NAME = ".dspark-patch-probed.json"
LIMIT = 1 << 20


@dataclass(frozen=True, kw_only=True)
class ProbeRecord:
    distribution: str
    version: str
    diff_sha256: str
    files: tuple[tuple[str, str | None], ...]   # (path, post-image sha256; None: the patch deletes it)
    probe_sha256: str                           # of the probe source that ran
    python: str
    python_version: str
    cache_tag: str


def holds(root: Path, record: ProbeRecord) -> bool:
    """Whether `root` keeps exactly `record`."""
    try:
        with ownfiles.open_folder(root, create=False) as folder:
            data = folder.read(NAME, limit=LIMIT)
        return data is not None and json.loads(data.decode("utf-8")) == _doc(record)
    except (BadInput, OSError, ValueError):
        return False


def write(root: Path, record: ProbeRecord) -> None:
    _change(root, lambda folder: folder.write(NAME, json.dumps(_doc(record), indent=1).encode("utf-8")))


def forget(root: Path) -> None:
    _change(root, lambda folder: folder.remove(NAME))


def check(root: Path) -> None:
    """Refuse now (BadInput) a link or folder where the record goes, before anything is written."""
    ownfiles.check_names(root, [NAME])


def _change(root: Path, how: Callable[[ownfiles.Folder], object]) -> None:
    try:
        with ownfiles.open_folder(root, create=False) as folder:
            how(folder)
    except OSError as exc:
        raise EnvironmentProblem(f"cannot write {root / NAME}: {exc.strerror or exc}") from None


def _doc(record: ProbeRecord) -> dict:
    doc = asdict(record)
    doc["files"] = [list(f) for f in record.files]
    return {"schema": SCHEMA, **doc}
