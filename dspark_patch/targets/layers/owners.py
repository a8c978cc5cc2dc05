"""The mode and owner `apply --image` writes for each entry of its layer, and the check of a top
layer against them (publish of the in-image job's layer, and `verify` on every route that reads
the image's layers).

`apply --image` writes the layer from its work container (root, umask 022, inside/layer.py):
- a folder the source holds keeps the source's mode and owner (the topmost layer's member, as
  the engine presents it); a folder it makes (a new `__pycache__`) is 0755, root's;
- a patched file keeps its pre-image's mode and owner (targets/fs.py writes in place of it);
- bytecode is py_compile's: root's, mode (the source's | 0o200) & 0o666, less the umask;
- a whiteout is an empty file, 0644, root's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ...references import bytecode_source
from .merge import owner
from .scan import LayerScan, path_key

NEW_FOLDER = (0o755, 0, 0)
NEW_FILE = (0o644, 0, 0)
UMASK = 0o022


def shown(owner: tuple[int, int, int]) -> str:
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
    """Each of `paths` (root-relative) the top layer holds, whose mode or owner is not what
    `apply --image` writes over `lower`, as one problem line each."""
    problems = []
    for path in sorted(paths):
        key = path_key(path)
        got = top.owners.get(key)
        if got is None:
            continue   # not a member of the top layer (or no folder nor kept member: nothing to judge)
        want = expected_owner(path, folder=top.present.get(key) is True, deleted=False, lower=lower)
        if got != want:
            problems.append(f"/{path} in the top layer has {shown(got)}, where apply writes {shown(want)}")
    return problems
