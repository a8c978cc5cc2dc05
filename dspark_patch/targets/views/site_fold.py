"""What `status` reads of one folder of a merged view, derived once per shared base.

A fleet's tags stand on the same lower layers: each one's view is its base's view plus a small
top layer (targets/layers/merge.py keeps, per view, its `base` and what the top layer `removed`
and `written`). What `find_site` reads of the site folder is a fold over the entries below it,
path by path: `SiteFold`, one ordered dict per kind of fact, keyed by the path below the folder,
in the view's order. A view's fold is its base's fold with the top layer's paths taken out and
put back, so a tag costs its own layer, not the 30,000 paths of its base.

Exact, by construction: every fact is a function of one path and its entry, so a path the top
layer neither removed nor wrote contributes what it contributed in the base. The one thing a
change could get wrong is order (a path written where the base already had one keeps its place
in the view): where that path gains a kind of fact it lacked in the base, the fold is made
afresh from the view. A large change (a base layer) is folded afresh too.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from ...distname import filename_name
from ...references import DISTUTILS_HACK, STARTUP_MODULES
from ...references.installer import METADATA_FILES
from ..layers import Entry, LayerView

# The kinds of facts, each an ordered dict keyed by the path below the folder.
FIELDS = ("symlinks", "top_level", "records", "metadata", "hashes", "others", "installer", "pth", "pth_all",
          "pyc_headers", "sources", "retained")


@dataclass(frozen=True, kw_only=True)
class SiteFold:
    symlinks: dict[str, str]            # symlinks in the distribution's own folders -> target
    top_level: dict[str, str]           # path -> the top-level name it makes the folder hold (site_files' list)
    records: dict[str, bytes]           # `X.dist-info/RECORD` -> its bytes (b"\0": over the cap)
    metadata: dict[str, bool]           # the distribution's own `X.dist-info/METADATA` files with bytes
    hashes: dict[str, str]              # regular files of its own folders -> sha256
    others: dict[str, bool]             # other entries of its own folders (not directories)
    installer: dict[str, bytes | None]  # files of its own dist-infos named like installer metadata
    pth: dict[str, bytes | None]        # top-level .pth files and distutils-precedence's module (regular files)
    pth_all: dict[str, bytes | None]    # every top-level `.pth` that is not a folder (None: not a readable file)
    pyc_headers: dict[str, bytes]
    sources: dict[str, tuple[int, int, bytes | None]]
    retained: dict[str, bytes]


def facts(rel: str, entry: Entry, top: str) -> dict[str, Any]:
    """What the path `rel` (below the folder) contributes, by kind of fact."""
    out: dict[str, Any] = {}
    first, sep, rest = rel.partition("/")
    own = own_folder(first, top)
    if own and entry.kind == "symlink":
        out["symlinks"] = entry.target or ""
    if first.split(".", 1)[0] in STARTUP_MODULES and (sep or entry.kind == "dir"):
        out["top_level"] = first  # a sitecustomize/ package is imported at start too
    elif not sep and entry.kind != "dir":
        out["top_level"] = rel
    if not sep and rel.endswith(".pth") and entry.kind != "dir":
        out["pth_all"] = entry.data if entry.kind == "file" and not entry.too_large else None
    if entry.kind == "file" and (not sep or rel == DISTUTILS_HACK):
        if rel.endswith(".pth") or rel == DISTUTILS_HACK:
            out["pth"] = None if entry.too_large else entry.data
    if not sep:
        return out
    if rest == "RECORD" and first.endswith(".dist-info") and (entry.data is not None or entry.too_large):
        out["records"] = entry.data if entry.data is not None else b"\0"
    if not own:
        return out
    if entry.data is not None and rest == "METADATA":
        out["metadata"] = True
    if entry.kind == "file" and first.endswith(".dist-info") and rest in METADATA_FILES:
        out["installer"] = None if entry.too_large else entry.data
    if entry.kind == "dir":
        return out
    if entry.kind == "file" and entry.sha256 is not None:
        out["hashes"] = entry.sha256
    else:
        out["others"] = True
    if entry.kind == "file" and rel != DISTUTILS_HACK:
        if entry.header is not None:
            out["pyc_headers"] = entry.header
        if entry.source is not None:
            out["sources"] = entry.source
        if entry.data is not None and rest not in ("RECORD", "METADATA"):
            out["retained"] = entry.data
    return out


def own_folder(first: str, top: str) -> bool:
    """Is the top-level name `first` one of the distribution's own folders (`vllm`, `vllm-….dist-info`)?"""
    return first == top or (first.endswith(".dist-info") and filename_name(first.split("-")[0]) == top)


def site_fold(view: LayerView, real: str, distribution: str) -> SiteFold:
    """The fold of the root-relative folder `real` (links already followed) of `view`."""
    return _fold(view, real, filename_name(distribution))


def _fold(view: LayerView, real: str, top: str) -> SiteFold:
    key = ("site_fold", real, top)
    with _DERIVING:  # CPU under the GIL: the tags read at once wait for one fold of their base
        found = view.derived.get(key)
        if found is None:
            found = view.derived[key] = _from_base(view, real, top) or _afresh(view, real, top)
        return found


def _below(entries: Iterable[tuple[str, Entry]], real: str) -> Iterator[tuple[str, Entry]]:
    prefix = real + "/" if real else ""
    for path, entry in entries:
        if path.startswith(prefix):
            yield path[len(prefix):], entry


def _afresh(view: LayerView, real: str, top: str) -> SiteFold:
    fields: dict[str, dict[str, Any]] = {name: {} for name in FIELDS}
    for rel, entry in _below(view.entries.items(), real):
        for name, value in facts(rel, entry, top).items():
            fields[name][rel] = value
    return SiteFold(**fields)


def _from_base(view: LayerView, real: str, top: str) -> SiteFold | None:
    """The fold from the base's, or None where it must be made afresh (see the module doc)."""
    base = view.base
    if base is None or len(view.removed) + len(view.written) > max(256, len(view.entries) // 8):
        return None
    was = _fold(base, real, top)
    fields = {name: getattr(was, name) for name in FIELDS}
    copied: set[str] = set()

    def change(name: str) -> dict[str, Any]:
        if name not in copied:
            fields[name] = dict(fields[name])
            copied.add(name)
        return fields[name]

    prefix = real + "/" if real else ""
    for path in view.removed:
        if path.startswith(prefix):
            rel = path[len(prefix):]
            for name in FIELDS:
                if rel in fields[name]:
                    del change(name)[rel]
    for path in view.written:
        if not path.startswith(prefix):
            continue
        rel = path[len(prefix):]
        new = facts(rel, view.entries[path], top)
        stayed = path in base.entries and path not in view.removed
        if stayed and any(rel not in fields[name] for name in new):
            return None  # a fact at a place the base's fold has no key for: order from the view
        for name in FIELDS:
            if name in new:
                change(name)[rel] = new[name]
            elif rel in fields[name]:
                del change(name)[rel]
    return SiteFold(**fields)


def everywhere_paths(view: LayerView, match: Any) -> frozenset[str]:
    """The view's paths that `match` (a function of the path alone) accepts, from its base's."""
    key = ("everywhere", match)
    with _DERIVING:
        found = view.derived.get(key)
        if found is None:
            base = view.base
            if base is None or len(view.removed) + len(view.written) > max(256, len(view.entries) // 8):
                found = frozenset(p for p in view.entries if match(p))
            else:
                found = (everywhere_paths(base, match) - view.removed) | {p for p in view.written if match(p)}
            view.derived[key] = found
        return found


_DERIVING = threading.RLock()
