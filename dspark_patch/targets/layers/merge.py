"""Layer scans stacked the way the engine unpacks them, and paths looked up as a chroot would.

`merge(scans)` goes bottom to top. For each layer, in one pass over what the lower layers left
(the kept entries and every symlink, never all members):
- a whiteout hides its path and everything below it, an opaque folder everything below it;
- any member of the layer at a kept path replaces it (a folder over a folder keeps the lower
  contents, as overlayfs merges folders); a non-folder — file, symlink, device, whether the
  predicate kept it or not — hides everything below its path;
then the layer's own kept entries land. Each pass is O(entries × depth) set lookups, so a merge
of L layers is O(L × entries × depth), whatever the whiteouts (docs/status.md: resource exhaustion).

`LayerView.resolve` follows symlinks in every component as the kernel does inside a chroot:
absolute targets start at the image's root, `..` stops at the root, 40 links at most.
`LayerView.stat` answers in the engine's path-stat format (`targets/interpreter.py`
reads it), so the interpreter search runs on a merged view exactly as on a container.
"""

from __future__ import annotations

import bisect
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...errors import UnreadableLayout
from ..imageconfig import GO_DIR, GO_LINK
from .scan import Entry, LayerScan, ancestors, path_key

MAX_LINKS = 40


@dataclass(frozen=True, kw_only=True)
class LayerView:
    entries: Mapping[str, Entry]
    where: str = "the image"

    # --- lookups --------------------------------------------------------------------------------
    def resolve(self, path: str, *, follow_last: bool = True) -> str:
        """`path` (absolute or relative to the root) with every symlink followed, as a
        root-relative path ("" is the root). A loop is an `UnreadableLayout`."""
        pending = [p for p in reversed(path.split("/")) if p]
        current: list[str] = []
        hops = 0
        while pending:
            part = pending.pop()
            if part == ".":
                continue
            if part == "..":
                if current:
                    current.pop()
                continue
            candidate = "/".join([*current, part])
            entry = self.entries.get(candidate)
            if entry is not None and entry.kind == "symlink" and (pending or follow_last):
                hops += 1
                if hops > MAX_LINKS:
                    raise UnreadableLayout(f"/{candidate} in {self.where} is a loop of symlinks",
                                           hint="nothing can be said about files reached through it")
                target = entry.target or ""
                if target.startswith("/"):
                    current = []
                pending.extend(p for p in reversed(target.split("/")) if p)
                continue
            current.append(part)
        return "/".join(current)

    def get(self, path: str) -> Entry | None:
        """The entry at `path` after following links (the last one too)."""
        return self.entries.get(self.resolve(path))

    def stat(self, path: str) -> dict[str, Any] | None:
        """The engine's path stat: mode (Go bits), size, linkTarget (fully resolved, absolute)."""
        parent = self.resolve(posixpath.dirname(path.rstrip("/")) or "/")
        own = posixpath.join(parent, posixpath.basename(path.rstrip("/"))) if parent else posixpath.basename(path.rstrip("/"))
        entry = self.entries.get(own)
        if entry is None:
            return None if own else {"name": "/", "mode": GO_DIR, "size": 0, "linkTarget": ""}
        if entry.kind == "symlink":
            real = self.resolve(own)
            target = self.entries.get(real)
            if target is None:
                return None
            return {"name": posixpath.basename(own), "mode": GO_LINK | 0o777, "size": target.size,
                    "linkTarget": "/" + real}
        mode = GO_DIR | 0o755 if entry.kind == "dir" else 0o644
        return {"name": posixpath.basename(own), "mode": mode, "size": entry.size, "linkTarget": ""}

    def read_head(self, path: str) -> bytes | None:
        entry = self.get(path)
        return entry.data if entry is not None and entry.kind == "file" else None

    def below(self, folder: str) -> Iterator[tuple[str, Entry]]:
        """Kept entries under the root-relative `folder` (not following links below it)."""
        prefix = folder + "/" if folder else ""
        for path, entry in self.entries.items():
            if path.startswith(prefix):
                yield path[len(prefix):], entry


def merge(scans: Iterable[LayerScan], *, where: str = "the image") -> LayerView:
    stack = tuple(scans)
    view: dict[str, Entry] = {}
    above: dict[str, list[int]] = {}   # kept path -> keys of its ancestors (computed once)
    start = 0
    # The longest bottom part of this stack merged before in this process: the images of a
    # fleet share their lower layers (the same scan objects: one save, one cache), so each is
    # its lower layers' view plus its own.
    for depth in range(len(stack), 0, -1):
        known = _merged.get(tuple(map(id, stack[:depth])))
        if known is not None and all(a is b for a, b in zip(known[0], stack, strict=False)):
            view, above, start = dict(known[1]), dict(known[2]), depth
            break
    for depth in range(start, len(stack)):
        _stack_one(view, above, stack[depth])
        above = {p: above[p] for p in view} if len(above) > 2 * len(view) + 64 else above
        if depth + 1 < len(stack):  # the views of lower layers alone: what another image may share
            _remember(stack[:depth + 1], view, above)
    return LayerView(entries=view, where=where)


def owner(scans: Sequence[LayerScan], path: str) -> tuple[int, int, int] | None:
    """(mode, uid, gid) of the root-relative `path` as the engine presents it: the topmost
    member at it (over a folder, overlayfs shows the upper folder's); None where no layer holds
    it, a layer above hides it, or its member was neither a folder nor kept."""
    key, folders = path_key(path), ancestors(path)
    for scan in reversed(scans):
        if key in scan.present:
            return scan.owners.get(key)
        if path in scan.whiteouts or any(f in scan.whiteouts or f in scan.opaques for f in folders):
            return None
    return None


_MERGED_KEPT = 8
_merged: dict[tuple[int, ...], tuple[tuple[LayerScan, ...], dict[str, Entry], dict[str, list[int]]]] = {}


def _remember(stack: tuple[LayerScan, ...], view: dict[str, Entry], above: dict[str, list[int]]) -> None:
    key = tuple(map(id, stack))
    _merged.pop(key, None)
    _merged[key] = (stack, dict(view), dict(above))  # the scans kept with it: their ids stay theirs
    while len(_merged) > _MERGED_KEPT:
        del _merged[next(iter(_merged))]


def _stack_one(view: dict[str, Entry], above: dict[str, list[int]], scan: LayerScan) -> None:
    """Put one layer on `view` (in place): see the module's docstring."""
    hide_all = scan.whiteouts                      # the path and everything below
    hide_below: set[str] = set(scan.opaques)       # everything below the path
    drop: set[str] = set()
    present = scan.present
    for path, entry in view.items():
        mine = present.get(path_key(path))
        if mine is not None and path not in scan.entries and not (mine and entry.kind == "dir"):
            drop.add(path)                         # replaced by a member the predicate did not keep
            if not mine:
                hide_below.add(path)
    # A non-folder of this layer stands above a lower path: only the view's folders can be one.
    folders = set().union(*(above[p] for p in view)) if view else set()
    blocked = {k for k in folders if present.get(k) is False}
    if blocked:
        drop.update(p for p in view if any(k in blocked for k in above[p]))
    for path, entry in scan.entries.items():
        if entry.kind != "dir":
            hide_below.add(path)
    if view and (hide_all or hide_below):
        drop.update(p for p in hide_all if p in view)
        keys: list[str] | None = None
        for hidden in (*hide_all, *hide_below):
            if path_key(hidden) not in folders:
                continue                           # nothing of the view lies below it
            if keys is None:
                keys = sorted(view)
            low = bisect.bisect_left(keys, hidden + "/")
            drop.update(keys[low:bisect.bisect_left(keys, hidden + "0", low)])  # "/" + 1 is "0"
    for path in drop:
        del view[path]
    for path, entry in scan.entries.items():
        view[path] = entry
        if path not in above:
            above[path] = [path_key(p) for p in ancestors(path)]
