"""The new layer a target took (the patched files, their bytecode, the folders above them), read
back with the strict layer reader: what it holds, its sha256 (the diff_id an image config names it
by) and size. Engine-free: an image target takes the tar from its work container, a local tree
(`apply --root --layer-out`) from its own interpreter."""

from __future__ import annotations

import hashlib
import io
import json
import re
from dataclasses import dataclass

from ...errors import CheckFailed
from .tarstream import TarStream


@dataclass(frozen=True, kw_only=True)
class LayerEntry:
    path: str                 # absolute, inside the image
    folder: bool
    sha256: str | None        # a file's content digest; None for a folder or a deletion
    deleted: bool = False     # a whiteout: the layer removes this path
    owner: tuple[int, int, int] = (0o644, 0, 0)   # (mode, uid, gid) as its header gives them
    pax: tuple[str, ...] = ()                     # the keys of its PAX records


@dataclass(frozen=True, kw_only=True)
class TakenLayer:
    """The new layer a target took: what it holds, as the strict layer reader read it, and the
    sha256 and size of its tar (the layer's diff_id in an image config)."""

    entries: tuple[LayerEntry, ...]
    diff_id: str
    size: int


# The temporary file inside/layer.py writes the tar to (tempfile.mkstemp's name, absolute).
_LAYER_FILE = re.compile(r"(?:/[^/\0]+)*/\.dspark-layer-[A-Za-z0-9_]+\.tar")


def layer_answer(answer: bytes) -> tuple[str, str, int] | None:
    """Where inside/layer.py says it wrote the layer tar, with its sha256 and size; None for an
    answer that is not that. The file named is read and then removed, so only a temporary file of
    that script's shape is taken (absolute, no '..'), never another path the python names."""
    try:
        said = json.loads(answer)
        where, sha, size = str(said["path"]), str(said["sha256"]), int(said["size"])
    except (ValueError, TypeError, KeyError):
        return None
    if ".." in where.split("/") or not _LAYER_FILE.fullmatch(where):
        return None
    return where, sha, size


def taken(layer: bytes) -> TakenLayer:
    """The layer a target took: its entries (`layer_entries`), sha256 and size."""
    return TakenLayer(entries=layer_entries(layer), diff_id="sha256:" + hashlib.sha256(layer).hexdigest(),
                      size=len(layer))


def layer_entries(layer: bytes) -> tuple[LayerEntry, ...]:
    """What a layer tar holds: each entry's path (absolute), kind and, for a file, its sha256.

    Read with the strict layer reader (targets/layers): a header the engine could read otherwise
    than we do, a path twice, an opaque folder, a link or a device is refused, never taken."""
    entries = []
    seen: set[str] = set()
    stream = TarStream(io.BytesIO(layer), where="the new layer")
    for member in stream:
        if not member.name:
            continue
        if member.name in seen:
            raise stream.refuse("a path twice in the new layer")
        seen.add(member.name)
        folder_name, _, base = member.name.rpartition("/")
        if base == ".wh..wh..opq" or base.startswith(".wh..wh."):
            raise CheckFailed(f"the new layer makes /{folder_name} opaque (it would hide the folder's lower contents)")
        if member.kind == "file" and base.startswith(".wh."):
            entries.append(LayerEntry(path=f"/{folder_name}/{base[4:]}" if folder_name else f"/{base[4:]}",
                                      folder=False, sha256=None, deleted=True, owner=member.owner, pax=member.pax))
            continue
        if member.kind not in ("file", "dir"):
            raise CheckFailed(f"the new layer holds {member.name}, which is neither a file nor a folder")
        digest = None
        if member.kind == "file":
            h = hashlib.sha256()
            for chunk in stream.chunks():
                h.update(chunk)
            digest = h.hexdigest()
        entries.append(LayerEntry(path="/" + member.name, folder=member.kind == "dir", sha256=digest,
                                  owner=member.owner, pax=member.pax))
    return tuple(entries)
