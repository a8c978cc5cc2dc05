"""The headers of the in-image job's layer, derived here: what `apply --image` of the source would
write for each entry, never what the job says.

`apply --image` writes the layer from its work container (root, umask 022, inside/layer.py):
- a folder the source holds keeps the source's mode and owner (the topmost layer's member, as
  the engine presents it); a folder it makes (a new `__pycache__`) is 0755, root's;
- a patched file keeps its pre-image's mode and owner (targets/fs.py writes in place of it);
- bytecode is py_compile's: root's, mode (the source's | 0o200) & 0o666, less the umask;
- a whiteout is an empty file, 0644, root's;
- PAX records only for a long name, a fractional time or a large number: `path`, `mtime`,
  `atime`, `ctime`, `size`, `uid`, `gid`, `uname`, `gname`. Any other record (an xattr such as
  `SCHILY.xattr.trusted.overlay.opaque`, an ACL, a link path, a comment) is one the engine may
  act on and apply never writes.
Anything else is refused: a folder made world-writable, another owner, a setuid bit, an xattr.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..references import bytecode_source
from ..targets.layers import LayerScan
from ..targets.layers.merge import owner
from ..targets.layers.new_layer import LayerEntry
from ..targets.layers.scan import path_key
from .claim import refuse

PAX_WRITTEN = frozenset({"path", "mtime", "atime", "ctime", "size", "uid", "gid", "uname", "gname"})
NEW_FOLDER = (0o755, 0, 0)
NEW_FILE = (0o644, 0, 0)
UMASK = 0o022


def _shown(owner: tuple[int, int, int]) -> str:
    return f"mode {owner[0]:04o}, owner {owner[1]}:{owner[2]}"


def expected_owner(path: str, *, folder: bool, deleted: bool, lower: Sequence[LayerScan]) -> tuple[int, int, int]:
    """What `apply --image` writes in the header (mode, uid, gid) of the root-relative `path` of its
    layer over the layers `lower`."""
    if deleted:
        return NEW_FILE
    if folder:
        return owner(lower, path) or NEW_FOLDER
    source = bytecode_source(path)
    if source is not None:
        mode = (owner(lower, source) or NEW_FILE)[0]
        return (mode | 0o200) & 0o666 & ~UMASK, 0, 0
    return owner(lower, path) or NEW_FILE


def top_layer_owners(top: LayerScan, lower: Sequence[LayerScan], paths: Iterable[str]) -> list[str]:
    """`verify --via registry`: each of `paths` (root-relative) the top layer holds, whose mode or
    owner is not what `apply --image` writes over `lower`, as one problem line each."""
    problems = []
    for path in sorted(paths):
        key = path_key(path)
        got = top.owners.get(key)
        if got is None:
            continue   # not a member of the top layer (or no folder nor kept member: nothing to judge)
        want = expected_owner(path, folder=top.present.get(key) is True, deleted=False, lower=lower)
        if got != want:
            problems.append(f"/{path} in the top layer has {_shown(got)}, where apply writes {_shown(want)}")
    return problems


def prove_headers(entries: Sequence[LayerEntry], scans: Sequence[LayerScan]) -> None:
    """Each entry's PAX records and (mode, uid, gid) are what apply --image would write, or one
    PublishRefused line names the first that is not."""
    for entry in entries:
        odd = sorted(set(entry.pax) - PAX_WRITTEN)
        if odd:
            raise refuse(f"{entry.path} in the layer carries the PAX record {odd[0]}, which apply never writes "
                         "(the engine may act on it)", hint="publish the layer the in-image run wrote, unchanged")
        want = expected_owner(entry.path.lstrip("/"), folder=entry.folder, deleted=entry.deleted, lower=scans)
        if entry.owner != want:
            raise refuse(f"{entry.path} in the layer has {_shown(entry.owner)}, where apply --image of the source "
                         f"would write {_shown(want)}", hint="run the in-image job as root, with umask 022, and "
                         "publish the layer it wrote, unchanged")
