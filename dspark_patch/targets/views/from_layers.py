"""An image's site folder rebuilt from its layer tars, for `status` on many images at once.

No engine here. Each layer tar (from `docker save`, see targets/docker/save_views.py) goes through
the one strict layer reader (`targets/layers`: refuses what tar readers could read differently,
retains only what `status_retain` asks for, merges the engine's way). Retained: every entry under a
`…/lib/python3.X/{site,dist}-packages/` folder (names and kinds), the sha256 of files in the
distribution's own folders, the bytes of every dist-info's RECORD and METADATA and of
`pyvenv.cfg` files and `/etc/debian_version`, the first bytes of every file in a `bin/` folder (interpreters and `#!`
lines), the `lib/python3.X/os.py` landmarks, and every symlink.

The site folder is the one the image's interpreters import from (`targets/views/site_folders.py`, the
same rule as the container route), looked up through symlinks as a chroot would.

Why layers: images of one fleet share their lower layers (tags of one serving image differ in a
small top layer), and one `docker save` of all of them carries each shared layer once, so
each is read and hashed once, however many images stand on it.
"""

from __future__ import annotations

import email.parser
import functools
import posixpath
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, BinaryIO

from ...distname import filename_name
from ...errors import AmbiguousDistribution, BadInput, TargetNotFound, UnreadableLayout, runs_first_message
from ...inside.locate import RECORD_CAP, BadRecord, parse_record
from ...references import DISTUTILS_HACK, PTH_CAP, ScriptBytes, all_scripts, bytecode_source, script_rows
from ...references.installer import METADATA_CAP, METADATA_FILES, SCRIPT_CAP
from ..layers import Entry, LayerView, RetainPredicate, scan_layer
from ..layers import merge as merge_scans
from ..layers.scan import Retain
from ..layers.tarstream import Kind
from ..runtime import runs_first
from .site_files import SiteFiles
from .site_fold import everywhere_paths, site_fold
from .site_fold import own_folder as _own

_SITE = re.compile(r"^(?P<site>(?:[^/]+/)*lib(?:64)?/python3(?:\.\d+)?/(?:site|dist)-packages)/(?P<rel>.+)$")
_LIB_DIR = re.compile(r"^(?:[^/]+/)*lib(?:64)?/python3(?:\.\d+)?(?:/(?:site|dist)-packages)?$")
_LANDMARK = re.compile(r"^(?:[^/]+/)*lib(?:64)?/python3\.\d+/os\.py$")
_MODULE_FILE = re.compile(r"^(?P<name>[^./]+)(?:\..*)?\.(?:py|pyc|so|pyd)$")
# targets/runtime.py's questions, kept by name wherever they are: module files of start-up hooks
# (and of the distribution, below), and the bytes of Debian's sitecustomize.
_STARTUP_PACKAGES = ("sitecustomize", "usercustomize", "apport_python_hook", "_distutils_hack")
_SITECUSTOMIZE = re.compile(r"^(?:etc/python3\.\d+|usr/lib/python3\.\d+)/sitecustomize\.py$")

__all__ = ["Entry", "LayerView", "find_site", "folder_view", "merge_scans", "pth_in", "site_files", "status_retain",
           "status_retain_identity"]




def status_retain(distribution: str, retain_paths: Iterable[str] = ()) -> RetainPredicate:
    """What `status` needs of a layer (root-relative paths, no leading slash). `retain_paths`:
    site-relative paths (the files known patch sets change) whose bytes, and whose bytecode's,
    are retained so that status/bytecode.py can recompile them."""
    top = filename_name(distribution)
    retained = frozenset(retain_paths)
    scripts = frozenset(all_scripts(distribution))

    def retain(path: str, kind: Kind) -> Retain:
        match = _SITE.match(path)
        if match is not None:
            first, sep, rest = match["rel"].partition("/")
            if kind == "dir":
                return "name"
            if sep and first.endswith(".dist-info") and rest in ("RECORD", "METADATA"):
                return ("capped", RECORD_CAP)
            if not sep and first.endswith(".pth"):
                return ("capped", PTH_CAP)
            if match["rel"] == DISTUTILS_HACK:
                return ("capped", PTH_CAP)   # what distutils-precedence.pth imports at every start
            if sep and _own(first, top) and first.endswith(".dist-info") and rest in METADATA_FILES:
                return ("capped", METADATA_CAP)  # the installer's metadata: its shape is checked
            if first == "bin" and rest in scripts:
                return ("capped", SCRIPT_CAP)   # `uv pip install --target`'s console scripts
            if sep and _own(first, top):
                rel = match["rel"]
                return "facts+bytes" if rel in retained or bytecode_source(rel) in retained else "facts"
            return "name"
        folder, _, base = path.rpartition("/")
        if kind == "dir":
            return "name" if _LIB_DIR.match(path) or base in (top, *_STARTUP_PACKAGES) else None
        if path in ("etc/passwd", "etc/ld.so.preload") or _SITECUSTOMIZE.match(path):
            return ("capped", 1 << 16)   # targets/runtime.py: the USER's HOME, Debian's start-up hook, the loader's preload
        if (base.split(".", 1)[0] in (top, *_STARTUP_PACKAGES) and base.endswith((".py", ".pyc", ".so"))) \
                or (base == "__init__.py" and folder.rpartition("/")[2] in (top, *_STARTUP_PACKAGES)):
            return "name"                # what `import` takes before the site folder (targets/runtime.py)
        if base == "pyvenv.cfg" or path == "etc/debian_version":
            return "bytes"
        if folder == "bin" or folder.endswith("/bin"):
            return ("capped", SCRIPT_CAP) if base in scripts else "head"
        return "name" if _LANDMARK.match(path) else None

    return retain


def status_retain_identity(distribution: str, retain_paths: Iterable[str] = ()) -> str:
    """Who `status_retain(distribution, retain_paths)` is, for the scan cache (targets/caches/scans.py):
    its parameters, the caps it keeps by, and the source of the reader and of this predicate, so
    that a scan made for another predicate or by another version of the reader is never reused."""
    from pathlib import Path

    from ... import __version__
    from ..caches.scans import scan_identity

    targets = Path(__file__).parent.parent
    sources = {name: (targets / name).read_bytes()
               for name in ("views/from_layers.py", "views/facts.py", "layers/scan.py", "layers/tarstream.py")}
    return scan_identity("status_retain", __version__, filename_name(distribution), *sorted(set(retain_paths)),
                         f"record_cap={RECORD_CAP}", f"pth_cap={PTH_CAP}", f"metadata_cap={METADATA_CAP}",
                         f"script_cap={SCRIPT_CAP}", *sorted(all_scripts(distribution)), sources=sources)


def folder_view(fileobj: BinaryIO, *, folder: str, where: str, distribution: str,
                retain: Iterable[str] = ()) -> LayerView:
    """The engine's tar of one folder (names start with the folder's own name) as a view."""
    parent = folder.strip("/").rpartition("/")[0]
    scan = scan_layer(fileobj, where=where, retain=status_retain(distribution, retain), prefix=parent)
    return merge_scans([scan], where=where)


def holds(view: LayerView, site: str, distribution: str) -> bool:
    """Would `import <distribution>` stop at this sys.path entry, as a regular package?

    A module file of that name (`vllm.py`, `vllm.cpython-311-….so`) or a symlink there is
    refused: the import goes somewhere status does not read."""
    top = filename_name(distribution)
    real = view.resolve(site)
    prefix = real + "/" if real else ""
    entry = view.entries.get(prefix + top)
    if entry is not None and entry.kind == "symlink":
        raise UnreadableLayout(f"{site}/{top} in {view.where} is a symlink (to {entry.target}): status reads no files "
                               f"through links in {distribution}'s folders", hint="nothing is said about this image")
    if entry is not None and entry.kind == "dir":
        init = view.entries.get(f"{prefix}{top}/__init__.py")
        if init is not None:
            if init.kind != "file":
                raise UnreadableLayout(f"{site}/{top}/__init__.py in {view.where} is not a regular file",
                                       hint="nothing is said about this image")
            return True
    for rel, _ in view.below(real):
        found = _MODULE_FILE.match(rel)
        if found and found["name"] == top and "/" not in rel:
            raise UnreadableLayout(f"{site}/{rel} in {view.where} is a module named {top}: `import {top}` would load "
                                   f"it, not the package", hint="nothing is said about this image")
    return False


def everywhere(view: LayerView, distribution: str) -> list[str]:
    match = _package_init(filename_name(distribution))
    return sorted({"/" + m["site"] for p in everywhere_paths(view, match) if (m := _SITE.match(p))})


@functools.lru_cache(maxsize=8)
def _package_init(top: str) -> Callable[[str], bool]:
    """Is a path a site folder's `<top>/__init__.py`? (one function per name: the views' memo key)"""
    tail = f"/{top}/__init__.py"

    def match(path: str) -> bool:
        return path.endswith(tail) and (m := _SITE.match(path)) is not None and m["rel"] == tail[1:]

    return match


def find_site(view: LayerView, distribution: str, config: Mapping[str, Any], ref: str) -> SiteFiles:
    """The site folder the image's interpreters import `distribution` from, read from the view."""
    from .site_folders import choose_site, interpreter_sites  # it stands on targets/docker, which imports this module

    def read_small(path: str) -> bytes | None:
        entry = view.get(path)
        return entry.data if entry is not None and entry.kind == "file" else None

    paths = interpreter_sites(config, view.stat, view.read_head, read_small)
    chosen, site = choose_site(ref, distribution, paths, lambda s: holds(view, s, distribution),
                               lambda: everywhere(view, distribution))
    found = site_files(view, distribution, site)
    if found is None:
        raise TargetNotFound(f"{site}/{filename_name(distribution)} in image {ref} has no {distribution} dist-info "
                             "(METADATA, RECORD)",
                             hint="the package was not installed as a distribution; nothing to check it against")
    first = runs_first(config, view.stat, read_small, site=site, python=found.python or chosen.python,
                       distribution=distribution, sites=chosen.sites, pth_files=lambda folder: pth_in(view, folder, distribution))
    if first:
        raise runs_first_message(ref, distribution, first)
    others = tuple(s for s in everywhere(view, distribution) if view.resolve(s) != view.resolve(site))
    return replace(found, python=found.python or chosen.python, unimported=others)


def pth_in(view: LayerView, folder: str, distribution: str = "vllm") -> dict[str, bytes | None] | None:
    """The `.pth` files right in `folder` (absolute) by name, their bytes as kept (None: over the
    cap, or not a regular file); None when the view has no such folder. (`distribution`: whose
    fold of the folder to read them from, the one site_files reads too.)"""
    real = view.resolve(folder)
    entry = view.entries.get(real)
    if entry is None or entry.kind != "dir":
        return None
    return dict(site_fold(view, real, distribution).pth_all)


def site_files(view: LayerView, distribution: str, site: str) -> SiteFiles | None:
    """The distribution in the site folder `site` (absolute, as the interpreter sees it), or None
    when that folder holds no dist-info of it. A symlink inside its own folders is refused.
    Read from the folder's fold (targets/views/site_fold.py): a tag on a known base costs its own layer."""
    top = filename_name(distribution)
    real = view.resolve(site)
    fold = site_fold(view, real, distribution)
    for rel, target in fold.symlinks.items():
        raise UnreadableLayout(f"{site}/{rel} in {view.where} is a symlink (to {target}): status reads no "
                               f"files through links in {distribution}'s folders",
                               hint="nothing is said about this image")
    records = {rel.partition("/")[0]: data for rel, data in fold.records.items()}
    own_infos = sorted(name for name in records if _own(name, top))
    if not fold.metadata or not own_infos:
        return None
    if len(own_infos) > 1:
        raise AmbiguousDistribution(f"{site} holds {len(own_infos)} {distribution} distributions ({', '.join(own_infos)})",
                                    hint="an installer leaves exactly one dist-info per distribution; which one is "
                                         "in use is not decidable")
    metadata_entry = view.entries.get(f"{real + '/' if real else ''}{own_infos[0]}/METADATA")
    metadata = metadata_entry.data if metadata_entry is not None else None
    if metadata is None:
        return None
    meta = email.parser.BytesParser().parsebytes(metadata, headersonly=True)
    with _PARSING:  # the tags read at once wait for one parse of their shared RECORD
        _record_rows(records[own_infos[0]], f"{site}/{own_infos[0]}/RECORD")  # a malformed RECORD is refused here
        record, rows = _record_and_scripts(records[own_infos[0]], distribution)
        listed = _listed(tuple(records.values()))
    found = re.search(r"/python(3\.\d+)/", "/" + real + "/")
    installer_meta = {rel: data for rel, data in fold.installer.items() if rel.partition("/")[0] in own_infos}
    scripts = {row: view_script(view, real, row) for row in rows}
    return SiteFiles(location=site, distribution=str(meta["Name"] or distribution), release=str(meta["Version"] or ""),
                     python=found.group(1) if found else None, record=record, hashes=fold.hashes,
                     others=tuple(sorted(fold.others)), top_level=tuple(sorted(set(fold.top_level.values()))),
                     listed_anywhere=listed, dist_infos=tuple(own_infos), metadata=installer_meta, scripts=scripts,
                     pth=fold.pth, pyc_headers=fold.pyc_headers, sources=fold.sources, retained=fold.retained)


def view_script(view: LayerView, real: str, row: str) -> ScriptBytes:
    """The console script a RECORD row of the site folder `real` (root-relative, links followed)
    names, as the merged view holds it (references.ScriptBytes). The row's `..` are taken from
    the real folder, as the kernel takes them."""
    path = posixpath.normpath(posixpath.join("/" + real, row)).lstrip("/")
    parent = view.resolve(posixpath.dirname(path) or "/")
    own = posixpath.join(parent, posixpath.basename(path)) if parent else posixpath.basename(path)
    entry = view.entries.get(own)
    if entry is None:
        return None
    if entry.kind == "symlink":
        return "a symlink"
    if entry.kind != "file":
        return "not a regular file"
    if entry.too_large:
        return f"over {SCRIPT_CAP} bytes"
    return entry.data if entry.data is not None else "not read"


def _record_rows(data: bytes, name: str, *, strict: bool = True) -> tuple[tuple[str, str | None, int | None], ...]:
    """A RECORD's rows; strict: a malformed one is BadInput naming the file and row."""
    try:
        if data == b"\0":
            raise BadRecord(f"over the {RECORD_CAP >> 20} MiB limit")
        return _parsed_record(data, strict)
    except (UnicodeDecodeError, BadRecord) as exc:
        if not strict:
            return ()
        reason = "not UTF-8" if isinstance(exc, UnicodeDecodeError) else str(exc)
        raise BadInput(f"{name}: {reason}", hint="the RECORD is malformed; rebuild the image from the release") from None


_PARSING = threading.Lock()


@functools.lru_cache(maxsize=16)
def _record_and_scripts(data: bytes, distribution: str) -> tuple[tuple[tuple[str, str | None], ...], tuple[str, ...]]:
    """A well-formed RECORD's (path, sha256) rows and the console-script rows among them, once per
    RECORD's bytes in a run (the tags of a fleet share their dist-info)."""
    record = tuple((path, sha) for path, sha, _ in _parsed_record(data, True))
    return record, script_rows(record, all_scripts(distribution))


@functools.lru_cache(maxsize=16)
def _listed(records: tuple[bytes, ...]) -> frozenset[str]:
    """The paths any of a site folder's RECORDs lists (a malformed one lists none)."""
    return frozenset(row[0] for data in records for row in _record_rows(data, "", strict=False))


@functools.lru_cache(maxsize=64)
def _parsed_record(data: bytes, strict: bool) -> tuple[tuple[str, str | None, int | None], ...]:
    """parse_record, once per RECORD's bytes in a run: the images of a fleet share most of theirs."""
    return tuple(parse_record(data.decode("utf-8"), strict=strict))
