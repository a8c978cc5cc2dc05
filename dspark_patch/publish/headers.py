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

from collections.abc import Sequence

from ..targets.layers import LayerScan
from ..targets.layers.new_layer import LayerEntry
from ..targets.layers.owners import expected_owner, shown
from .claim import refuse

PAX_WRITTEN = frozenset({"path", "mtime", "atime", "ctime", "size", "uid", "gid", "uname", "gname"})


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
            raise refuse(f"{entry.path} in the layer has {shown(entry.owner)}, where apply --image of the source "
                         f"would write {shown(want)}", hint="run the in-image job as root, with umask 022, and "
                         "publish the layer it wrote, unchanged")
