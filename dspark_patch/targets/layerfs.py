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

import email.parser
import hashlib
import posixpath
import re
import tarfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from ..errors import AmbiguousDistribution, BadInput
from ..inside.locate import RECORD_CAP, BadRecord, parse_record
from ..references import PTH_CAP, STARTUP_MODULES
from .facts import read_facts
from .sitefiles import SiteFiles

_SITE = re.compile(r"^(?P<site>(?:[^/]+/)*lib/python3(?:\.\d+)?/(?:site|dist)-packages)/(?P<rel>.+)$")
_PY_BIN = re.compile(r"(?:^|/)bin/python(3\.\d+)$")
_PY_DIR = re.compile(r"/python(3\.\d+)/")

Kind = Literal["file", "dir", "other", "whiteout", "opaque"]


@dataclass(frozen=True, slots=True)
class Entry:
    kind: Kind
    sha256: str | None = None
    data: bytes | None = None     # RECORD and METADATA of dist-infos, top-level .pth, kept files
    header: bytes | None = None   # a .pyc's first 16 bytes
    source: tuple[int, int, bytes | None] | None = None   # a .py's (mtime, size, source hash)
    too_large: bool = False       # a RECORD or .pth over its cap: not read


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


class LayerIndexer:
    def __init__(self, distribution: str, *, keep: Iterable[str] = ()) -> None:
        self.top = _normalize(distribution)
        self.keep = frozenset(keep)   # site-relative paths whose bytes (and bytecode's) are kept

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
                if member.size > RECORD_CAP:
                    entries[path] = Entry("file", too_large=True)
                    continue
                data = _read(tar, member)
                entries[path] = Entry("file", hashlib.sha256(data).hexdigest(), data)
            elif sep and self._own(first):
                entries[path] = _own_entry(tar, member, rel, self.keep)
            elif not sep and rel.endswith(".pth"):
                entries[path] = (Entry("file", too_large=True) if member.size > PTH_CAP
                                 else Entry("file", data=_read(tar, member)))
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
        if first.split(".", 1)[0] in STARTUP_MODULES and (sep or entry.kind == "dir"):
            top_level.append(first)  # a sitecustomize/ package is imported at start too
        if not sep:
            if entry.kind != "dir":
                top_level.append(rel)
            continue
        if rest == "RECORD" and (entry.data is not None or entry.too_large):
            records[first] = entry.data if entry.data is not None else b"\0"  # over the cap: refused below
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
    if len(own_infos) > 1:
        raise AmbiguousDistribution(f"/{site} holds {len(own_infos)} {distribution} distributions ({', '.join(own_infos)})",
                                    hint="an installer leaves exactly one dist-info per distribution; which one is "
                                         "in use is not decidable")
    metadata = view.get(f"{prefix}{own_infos[0]}/METADATA", Entry("file")).data
    if metadata is None:
        return None
    meta = email.parser.BytesParser().parsebytes(metadata, headersonly=True)
    record = tuple((path, sha) for path, sha, _ in _record_rows(records[own_infos[0]], f"/{site}/{own_infos[0]}/RECORD"))
    listed = frozenset(row[0] for data in records.values() for row in _record_rows(data, "", strict=False))
    extra = _extra_facts(view, prefix, own)
    found = _PY_DIR.search("/" + site + "/")
    python = found.group(1) if found else next(
        (m.group(1) for p in sorted(view, reverse=True) if (m := _PY_BIN.search(p))), None)
    return SiteFiles(location="/" + site, distribution=str(meta["Name"] or distribution), release=str(meta["Version"] or ""),
                     python=python, record=record, hashes=hashes, others=tuple(sorted(others)),
                     top_level=tuple(sorted(set(top_level))), listed_anywhere=listed, dist_infos=tuple(own_infos), **extra)


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


def _record_rows(data: bytes, name: str, *, strict: bool = True) -> list[tuple[str, str | None, int | None]]:
    """A RECORD's rows; strict: a malformed one is BadInput naming the file and row."""
    try:
        if data == b"\0":
            raise BadRecord(f"over the {RECORD_CAP >> 20} MiB limit")
        return parse_record(data.decode("utf-8"), strict=strict)
    except (UnicodeDecodeError, BadRecord) as exc:
        if not strict:
            return []
        reason = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise BadInput(f"{name}: {reason}", hint="the RECORD is malformed; rebuild the image from the release") from None


def _own_entry(tar: tarfile.TarFile, member: tarfile.TarInfo, rel: str, keep: frozenset[str]) -> Entry:
    from ..references import bytecode_source

    fh = tar.extractfile(member)
    assert fh is not None
    facts = read_facts(rel, fh.read, keep=rel in keep or bytecode_source(rel) in keep)
    return Entry("file", facts.sha256, facts.data, header=facts.header,
                 source=(int(member.mtime), facts.size, facts.source_hash) if rel.endswith(".py") else None)


def _extra_facts(view: dict[str, Entry], prefix: str, own: Callable[[str], bool]) -> dict:
    """The SiteFiles fields for .pth and bytecode (targets/facts.py) from a merged view."""
    pth: dict[str, bytes | None] = {}
    headers: dict[str, bytes] = {}
    sources: dict[str, tuple[int, int, bytes | None]] = {}
    kept: dict[str, bytes] = {}
    for path, entry in view.items():
        if not path.startswith(prefix) or entry.kind != "file":
            continue
        rel = path[len(prefix):]
        first, sep, rest = rel.partition("/")
        if not sep:
            if rel.endswith(".pth"):
                pth[rel] = entry.data
            continue
        if not own(first):
            continue
        if entry.header is not None:
            headers[rel] = entry.header
        if entry.source is not None:
            sources[rel] = entry.source
        if entry.data is not None and rest not in ("RECORD", "METADATA"):
            kept[rel] = entry.data
    return {"pth": pth, "pyc_headers": headers, "sources": sources, "kept": kept}
