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
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import UnreadableLayout
from ..imageconfig import GO_DIR, GO_LINK
from .scan import Entry, LayerScan, ancestors, path_key

MAX_LINKS = 40


@dataclass(frozen=True, kw_only=True)
class LayerView:
    entries: Mapping[str, Entry]
    where: str = "the image"
    # How this view came to be: `base`, the view of the layers below the top one (None: none kept),
    # then the top layer removed `removed` and wrote its own entries, `written`, in its order. So
    # `entries` is `base.entries` less `removed`, then each of `written` set (one that stayed
    # keeps its place). What views/ derive from a view is derived from its base's and this
    # change (targets/views/site_fold.py), and kept in `derived`. The base is held weakly: the
    # merge memo below keeps a few; a view never keeps its lower layers' copies alive.
    base_ref: weakref.ref[LayerView] | None = field(default=None, compare=False, repr=False)
    removed: frozenset[str] = field(default=frozenset(), compare=False, repr=False)
    written: tuple[str, ...] = field(default=(), compare=False, repr=False)
    derived: dict[Any, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def base(self) -> LayerView | None:
        return self.base_ref() if self.base_ref is not None else None

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
    # One merge at a time: it is CPU under the GIL, so threads gain nothing by merging side by
    # side, and the images of a fleet read at once would each merge their shared base.
    with _MERGING:
        return _merge(tuple(scans), where)


def _merge(stack: tuple[LayerScan, ...], where: str) -> LayerView:
    state = _State(view={}, above={}, index={}, folders=set())
    base: LayerView | None = None
    start = 0
    # The longest bottom part of this stack merged before in this process: the images of a
    # fleet share their lower layers (the same scan objects: one save, one cache), so each is
    # its lower layers' view plus its own.
    for depth in range(len(stack), 0, -1):
        known = _merged.get(tuple(map(id, stack[:depth])))
        if known is not None and all(a is b for a, b in zip(known[0], stack, strict=False)):
            state, base, start = known[1].copy(), known[2], depth
            break
    removed: frozenset[str] = frozenset()
    written: tuple[str, ...] = ()
    for depth in range(start, len(stack)):
        if depth > start:  # the views of lower layers alone: what another image may share
            base = _remember(stack[:depth], state, base, removed, written, where)
        removed, written = frozenset(_stack_one(state, stack[depth])), tuple(stack[depth].entries)
    return LayerView(entries=state.view, where=where, base_ref=_weak(base), removed=removed, written=written)


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
_MERGING = threading.Lock()


@dataclass(kw_only=True)
class _State:
    """A merge in progress: the view, and what makes stacking a small layer on it cost the layer's
    size, not the view's."""

    view: dict[str, Entry]
    above: dict[str, list[int]]   # kept path -> keys of its ancestors (computed once)
    index: dict[int, str]         # path_key(path) -> path, for every path of the view
    folders: set[int]             # keys of the folders above the view's paths (after a drop, more: harmless)

    def copy(self) -> _State:
        return _State(view=dict(self.view), above=dict(self.above), index=dict(self.index), folders=set(self.folders))


_merged: dict[tuple[int, ...], tuple[tuple[LayerScan, ...], _State, LayerView]] = {}


def _remember(stack: tuple[LayerScan, ...], state: _State, base: LayerView | None, removed: frozenset[str],
              written: tuple[str, ...], where: str) -> LayerView:
    """Keep the view of `stack` (the scans kept with it: their ids stay theirs); returns it as a
    view, so that the view stacked on it can name it as its base."""
    kept = state.copy()
    view = LayerView(entries=kept.view, where=where, base_ref=_weak(base), removed=removed, written=written)
    key = tuple(map(id, stack))
    _merged.pop(key, None)
    _merged[key] = (stack, kept, view)
    for old in list(_merged)[:-_MERGED_KEPT]:  # the oldest (another thread may evict the same one)
        _merged.pop(old, None)
    return view


def _weak(view: LayerView | None) -> weakref.ref[LayerView] | None:
    return weakref.ref(view) if view is not None else None


def _stack_one(state: _State, scan: LayerScan) -> set[str]:
    """Put one layer on the view (in place): see the module's docstring. Returns the paths it
    removed from the view (the layer's own entries then land, in its order). The lookups go from
    the smaller side: a tag's one-file layer over a base of 30,000 paths costs its own size."""
    view, above, index, folders = state.view, state.above, state.index, state.folders
    hide_all = scan.whiteouts                      # the path and everything below
    hide_below: set[str] = set(scan.opaques)       # everything below the path
    drop: set[str] = set()
    present = scan.present
    if len(present) < len(view):
        pairs: Iterable[tuple[str, bool]] = ((path, mine) for key, mine in present.items()
                                             if (path := index.get(key)) is not None)
    else:
        pairs = ((path, mine) for path in view if (mine := present.get(path_key(path))) is not None)
    for path, mine in pairs:
        if path not in scan.entries and not (mine and view[path].kind == "dir"):
            drop.add(path)                         # replaced by a member the predicate did not keep
            if not mine:
                hide_below.add(path)
    # A non-folder of this layer stands above a lower path: only the view's folders can be one.
    if len(present) < len(folders):
        blocked = {k for k, mine in present.items() if mine is False and k in folders}
    else:
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
        index.pop(path_key(path), None)
    for path, entry in scan.entries.items():
        view[path] = entry
        if path not in above:
            above[path] = [path_key(p) for p in ancestors(path)]
        folders.update(above[path])
        index[path_key(path)] = path
    if len(above) > 2 * len(view) + 64:
        state.above = {p: above[p] for p in view}
    return drop
