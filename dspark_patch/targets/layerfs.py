"""An image's site folders rebuilt from its layer tars, for `status` on many images at once.

No engine here: `LayerIndexer` is fed layer tars (from `docker save`, see
targets/docker/reader.py) and keeps, per layer, only what the check needs: every entry under
a `…/lib/python3.X/{site,dist}-packages/` folder (names and kinds), the sha256 of files in
the distribution's own folders, the bytes of every dist-info's RECORD and METADATA, the
`…/bin/python3.X` names, and whiteouts. `merge` stacks layers the OCI way (whiteouts and
opaque folders hide what lower layers had), and `site_files` turns the result into the same
`SiteFiles` the container view gives.

Why: images of one fleet share their lower layers (tags of one serving image differ in a
small top layer), and one `docker save` of all of them carries each shared layer once, so
each is read and hashed once, however many images stand on it.
"""

from __future__ import annotations

import csv
import email.parser
import hashlib
import io
import posixpath
import re
import tarfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from .sitefiles import SiteFiles

_SITE = re.compile(r"^(?P<site>(?:[^/]+/)*lib/python3(?:\.\d+)?/(?:site|dist)-packages)/(?P<rel>.+)$")
_PY_BIN = re.compile(r"(?:^|/)bin/python(3\.\d+)$")
_PY_DIR = re.compile(r"/python(3\.\d+)/")

Kind = Literal["file", "dir", "other", "whiteout", "opaque"]


@dataclass(frozen=True, slots=True)
class Entry:
    kind: Kind
    sha256: str | None = None
    data: bytes | None = None     # RECORD and METADATA of dist-infos


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


class LayerIndexer:
    def __init__(self, distribution: str) -> None:
        self.top = _normalize(distribution)

    def _own(self, first: str) -> bool:
        return first == self.top or (first.endswith(".dist-info") and _normalize(first.split("-")[0]) == self.top)

    def index(self, tar: tarfile.TarFile, *, prefix: str = "") -> dict[str, Entry]:
        """One layer: path (no leading slash) -> Entry, for the paths the check needs.

        `prefix`: the folder the tar's names are relative to (an archive of one folder)."""
        entries: dict[str, Entry] = {}
        for member in tar:
            path = posixpath.normpath(posixpath.join(prefix, member.name).lstrip("/")).removeprefix("./")
            folder, base = posixpath.split(path)
            if base == ".wh..wh..opq":
                entries[folder + "/.wh..wh..opq"] = Entry("opaque")
                continue
            if base.startswith(".wh."):
                entries[posixpath.join(folder, base[4:])] = Entry("whiteout")
                continue
            if _PY_BIN.search(path):
                entries[path] = Entry("other")
                continue
            match = _SITE.match(path)
            if match is None:
                continue
            rel = match["rel"]
            first, sep, rest = rel.partition("/")
            if member.isdir():
                entries[path] = Entry("dir")
            elif not member.isfile():
                entries[path] = Entry("other")
            elif sep and first.endswith(".dist-info") and rest in ("RECORD", "METADATA"):
                data = _read(tar, member)
                entries[path] = Entry("file", hashlib.sha256(data).hexdigest(), data)
            elif sep and self._own(first):
                entries[path] = Entry("file", _hash(tar, member))
            else:
                entries[path] = Entry("file")
        return entries


def merge(layers: Iterable[dict[str, Entry]]) -> dict[str, Entry]:
    """Stack layers bottom to top: a layer's whiteouts hide lower paths, then its entries land."""
    view: dict[str, Entry] = {}

    def drop(path: str, *, itself: bool) -> None:
        prefix = path + "/"
        for key in [k for k in view if k.startswith(prefix) or (itself and k == path)]:
            del view[key]

    for layer in layers:
        for path, entry in layer.items():
            if entry.kind == "opaque":
                drop(path.removesuffix("/.wh..wh..opq"), itself=False)
            elif entry.kind == "whiteout":
                drop(path, itself=True)
        for path, entry in layer.items():
            if entry.kind in ("whiteout", "opaque"):
                continue
            if entry.kind != "dir" and path in view and view[path].kind == "dir":
                drop(path, itself=False)  # a file over a folder hides the folder's contents
            view[path] = entry
    return view


def site_files(view: dict[str, Entry], distribution: str, prefer: Sequence[str] = ()) -> SiteFiles | None:
    """The distribution's site folder in a merged view, or None when no site folder holds it.

    `prefer`: site folders (absolute) in the order the image's PATH would reach them."""
    top = _normalize(distribution)
    sites = sorted({m["site"] for p in view if (m := _SITE.match(p)) and m["rel"].split("/")[0] == top})
    if not sites:
        return None
    ranked = sorted(sites, key=lambda s: (("/" + s) not in prefer, prefer.index("/" + s) if "/" + s in prefer else 0))
    site = ranked[0]
    own = lambda first: first == top or (first.endswith(".dist-info") and _normalize(first.split("-")[0]) == top)  # noqa: E731
    hashes: dict[str, str] = {}
    others: list[str] = []
    top_level: list[str] = []
    records: dict[str, bytes] = {}
    metadata: bytes | None = None
    prefix = site + "/"
    for path, entry in view.items():
        if not path.startswith(prefix):
            continue
        rel = path[len(prefix):]
        first, sep, rest = rel.partition("/")
        if not sep:
            if entry.kind != "dir":
                top_level.append(rel)
            continue
        if entry.data is not None and rest == "RECORD":
            records[first] = entry.data
        if entry.data is not None and rest == "METADATA" and own(first):
            metadata = entry.data
        if not own(first) or entry.kind == "dir":
            continue
        if entry.kind == "file" and entry.sha256 is not None:
            hashes[rel] = entry.sha256
        else:
            others.append(rel)
    own_infos = sorted(name for name in records if own(name))
    if metadata is None or not own_infos:
        return None
    meta = email.parser.BytesParser().parsebytes(metadata, headersonly=True)
    record = tuple((row[0], _hex(row[1] if len(row) > 1 else "")) for row in _rows(records[own_infos[0]]))
    listed = frozenset(row[0] for data in records.values() for row in _rows(data))
    found = _PY_DIR.search("/" + site + "/")
    python = found.group(1) if found else next(
        (m.group(1) for p in sorted(view, reverse=True) if (m := _PY_BIN.search(p))), None)
    return SiteFiles(location="/" + site, distribution=str(meta["Name"] or distribution), release=str(meta["Version"] or ""),
                     python=python, record=record, hashes=hashes, others=tuple(sorted(others)),
                     top_level=tuple(sorted(top_level)), listed_anywhere=listed)


def _read(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    fh = tar.extractfile(member)
    assert fh is not None
    return fh.read()


def _hash(tar: tarfile.TarFile, member: tarfile.TarInfo) -> str:
    fh = tar.extractfile(member)
    assert fh is not None
    digest = hashlib.sha256()
    for chunk in iter(lambda: fh.read(1 << 20), b""):
        digest.update(chunk)
    return digest.hexdigest()


def _rows(data: bytes) -> list[list[str]]:
    try:
        return [row for row in csv.reader(io.StringIO(data.decode("utf-8"))) if row]
    except (UnicodeDecodeError, csv.Error):
        return []


def _hex(field: str) -> str | None:
    import base64

    algo, _, value = field.partition("=")
    if algo != "sha256" or not value:
        return None
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()
