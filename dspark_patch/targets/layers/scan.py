"""One layer tar read once, retaining only what a check asks for: `scan_layer(fileobj, retain=…)`.

The result, `LayerScan`, is what a merge needs and no more: the members the `retain` predicate
chose (with their sha256, their bytes or their first bytes), every symlink (a link can move
any path, so none may be dropped), the layer's whiteouts and opaque folders, and one machine
word per member (`present`: a path's hash -> is it a folder) so that a member the predicate did
not keep can still hide what lower layers hold under it. No names or headers of the other
members are kept. A scan depends only on the layer's bytes and the predicate, so a registry
route can cache it by layer digest (targets/caches/scans.py); `present` uses Python's per-process `hash`, so a
cache that outlives the process must rebuild it (or switch to a stable digest).

Inside one layer the engine's unpacking is followed (moby `archive.UnpackLayer`, containerd
`archive.Apply`): a later member replaces an earlier one at its path, a non-folder that
replaces a folder hides everything the layer put under it before. What engines do differently
is refused: a member under a non-folder of the same layer (moby fails, containerd follows
links), a whiteout and a member for the same path, a hard link to anything but an earlier
regular file of the same layer (overlay2 links inside the layer, containerd inside the merged
tree), aufs-internal `.wh..wh.*` names.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import BinaryIO, Literal

from ..views.facts import read_facts
from .tarstream import Kind, Limits, TarStream

EntryKind = Literal["file", "dir", "symlink", "other"]
# "facts": sha256 plus what a bytecode check needs (targets/views/facts.py: a .py's size, mtime and
# source hash, a .pyc's 16-byte header); "facts+bytes": and the bytes; ("capped", N): the bytes
# when at most N, else only a `too_large` mark (a RECORD or .pth over its cap is refused later,
# by whoever reads it, with its own message).
Retain = Literal["name", "hash", "bytes", "head", "facts", "facts+bytes"] | tuple[Literal["capped"], int] | None
RetainPredicate = Callable[[str, Kind], Retain]
HEAD_BYTES = 256
BYTES_CAP = 64 << 20
OPAQUE = ".wh..wh..opq"


@dataclass(frozen=True, slots=True)
class Entry:
    kind: EntryKind
    sha256: str | None = None
    data: bytes | None = None      # the member's bytes ("bytes") or its first HEAD_BYTES ("head")
    target: str | None = None      # a symlink's target, as written
    size: int = 0
    header: bytes | None = None    # "facts" of a .pyc: its first 16 bytes
    source: tuple[int, int, bytes | None] | None = None   # "facts" of a .py: (mtime, size, source hash)
    too_large: bool = False        # ("capped", N) over N: not read


@dataclass(frozen=True, kw_only=True)
class LayerScan:
    where: str
    entries: Mapping[str, Entry]            # kept members and every symlink, as the layer leaves them
    whiteouts: frozenset[str]               # paths a `.wh.NAME` removes from lower layers (with all below)
    opaques: frozenset[str]                 # folders whose lower contents `.wh..wh..opq` hides
    present: Mapping[int, bool]             # path_key(path) -> folder?, for every member and folder implied by one
    # path_key(path) -> (mode, uid, gid) as written, for every folder member and every kept member:
    # what a layer that rewrites such a path must keep (publish derives a layer's headers from it)
    owners: Mapping[int, tuple[int, int, int]] = field(default_factory=dict)


@functools.lru_cache(maxsize=1 << 18)
def path_key(path: str) -> int:
    """A path's 64-bit key in `present`: the same in every process (a cached scan is merged in
    another run); 64 bits keep a collision out of reach for millions of members. Memoised: a
    layer's folders are the ancestors of many members."""
    return int.from_bytes(hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=8).digest(), "little")


def ancestors(path: str) -> list[str]:
    """`a/b/c` -> [`a`, `a/b`]."""
    found = []
    at = path.find("/")
    while at != -1:
        found.append(path[:at])
        at = path.find("/", at + 1)
    return found


def scan_layer(fileobj: BinaryIO, *, where: str, retain: RetainPredicate, limits: Limits = Limits(),
               prefix: str = "") -> LayerScan:
    """`prefix`: the folder the tar's names are relative to (the engine's tar of one folder)."""
    tar = TarStream(fileobj, where=where, limits=limits)
    entries: dict[str, Entry] = {}
    order: dict[str, int] = {}             # kept path -> member index (for same-layer replacements)
    present: dict[int, bool] = {}
    gone: set[int] = set()                 # hashes of this layer's whiteout targets
    whiteouts: set[str] = set()
    opaques: set[str] = set()
    replaced: dict[str, int] = {}          # folder path -> index of the non-folder that replaced it
    owners: dict[int, tuple[int, int, int]] = {}
    for member in tar:
        path = f"{prefix}/{member.name}" if prefix and member.name else member.name
        if not path:
            continue  # the root folder itself
        above = ancestors(path)
        for folder in above:
            h = path_key(folder)
            if present.get(h) is False:
                raise tar.refuse(f"a member under {folder!r}, which this layer made a non-folder "
                                 "(engines fail or follow it differently)")
            if h in gone:
                raise tar.refuse(f"a member under {folder!r}, which this layer also whites out")
        folder, _, base = path.rpartition("/")
        if base.startswith(".wh."):
            if base == OPAQUE:
                opaques.add(folder)
            elif base.startswith(".wh..wh."):
                raise tar.refuse("an aufs-internal whiteout name")
            else:
                target = f"{folder}/{base[4:]}" if folder else base[4:]
                if base[4:] in (".", "..") or path_key(target) in present:
                    raise tar.refuse("a whiteout of a path this layer also holds (or of '.'/'..')")
                whiteouts.add(target)
                gone.add(path_key(target))
            for f in above:
                present.setdefault(path_key(f), True)
            continue
        h = path_key(path)
        if h in gone:
            raise tar.refuse("a member at a path this layer also whites out")
        is_dir = member.kind == "dir"
        before = present.get(h)
        if before is not None and not (before and is_dir):
            entries.pop(path, None)
            if before and not is_dir:
                replaced[path] = member.index  # a non-folder over a folder: what the layer put below is gone
        present[h] = is_dir
        for f in above:
            present.setdefault(path_key(f), True)
        owners.pop(h, None)
        if is_dir:
            owners[h] = member.owner
        if member.kind == "symlink":
            entries[path] = Entry("symlink", target=member.linkname)
            order[path] = member.index
            continue
        if member.kind == "hardlink":
            if present.get(path_key(member.linkname)) is not False or member.linkname == path:
                raise tar.refuse(f"a hard link to {member.linkname!r}, which is no earlier file of this layer "
                                 "(engines resolve it in different trees)")
            if retain(path, "file"):
                source = entries.get(member.linkname)
                entries[path] = source if source is not None and source.kind == "file" else Entry("other")
                order[path] = member.index
            continue
        wanted = retain(path, member.kind)
        if not wanted:
            continue
        owners[h] = member.owner
        order[path] = member.index
        if member.kind == "dir":
            entries[path] = Entry("dir")
        elif member.kind != "file":
            entries[path] = Entry("other")
        elif wanted == "bytes":
            data = tar.read_all(BYTES_CAP)
            entries[path] = Entry("file", sha256=hashlib.sha256(data).hexdigest(), data=data, size=member.size)
        elif wanted == "head":
            head = b""
            for chunk in tar.chunks():
                if len(head) < HEAD_BYTES:
                    head += chunk[:HEAD_BYTES - len(head)]
            entries[path] = Entry("file", data=head, size=member.size)
        elif isinstance(wanted, tuple):
            if member.size > wanted[1]:
                entries[path] = Entry("file", size=member.size, too_large=True)
            else:
                data = tar.read_all(wanted[1])
                entries[path] = Entry("file", sha256=hashlib.sha256(data).hexdigest(), data=data, size=member.size)
        elif wanted in ("facts", "facts+bytes"):
            facts = read_facts(path, tar.chunks(), retain=wanted == "facts+bytes")
            entries[path] = Entry("file", sha256=facts.sha256, data=facts.data, size=member.size, header=facts.header,
                                  source=(member.mtime, facts.size, facts.source_hash) if path.endswith(".py") else None)
        elif wanted == "hash":
            digest = hashlib.sha256()
            for chunk in tar.chunks():
                digest.update(chunk)
            entries[path] = Entry("file", sha256=digest.hexdigest(), size=member.size)
        else:
            entries[path] = Entry("file", size=member.size)
    if replaced:  # one pass: O(kept × depth)
        for path in [p for p in entries if any(order[p] < replaced.get(a, -1) for a in ancestors(p))]:
            del entries[path]
    return LayerScan(where=where, entries=entries, whiteouts=frozenset(whiteouts), opaques=frozenset(opaques),
                     present=present, owners=owners)
