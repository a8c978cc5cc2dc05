"""Gather an installed distribution's files, and prove its bytecode, with the target's interpreter.

Usage: python -I -B -c SOURCE REQUEST_JSON, where the request is
  {"location": DIR, "folders": [the distribution's own top-level folders],
   "patched": [patched source paths, relative to location],
   "proofs": base64 of 16-byte proofs (optional, see below),
   "hash": false to leave the files' sha256 to the host (optional, default true),
   "scripts": [RECORD rows of console scripts, relative to location, to read (optional)]}
Prints {"files": {path: [sha256 or null, size]}, "others": [entries that are not regular files],
"top_level": [names], "pth": {name: text (latin-1) or null}, "pth_listed": [names],
"bytecode": {pyc path: why-not-or-""}, "metadata", "scripts" (`installer_files`), "identity",
"proofs", "proofs_reused"}. The host (dspark_patch.references
`compare`) checks those facts against the published wheel; nothing here trusts the RECORD.

Every entry is looked at with lstat first: a FIFO, socket, device or symlink is listed in
`others` and never opened, so nothing here can block on it.

Bytecode (`bytecode`): every `__pycache__/m.<this interpreter's tag>[.opt-N].pyc` whose source
`m.py` is there, i.e. every .pyc this interpreter would load, is recompiled from its source with
this interpreter and compared: byte for byte first, then as code objects (`==`, which compares
the bytecode, constants, names and line tables but not `co_filename`, the path the file was
compiled at: pip compiles in a temporary folder, so bytes of pip-written timestamp bytecode
never match a fresh compile, its code objects do). Where they differ only in instructions and
line tables (the names, constants and nesting are the source's), the message says so and how to
rewrite it: another patch release of the interpreter writes other instructions for a few
functions (3.11.7 and 3.11.2 do for 6 of vLLM 0.33.0's modules), and an attacker can too, so
it is a finding like any other. A .pyc the interpreter would not load (its
header does not match the source, another magic number) is harmless and skipped, except for the
patched files, whose bytecode the tool wrote checked-hash: there any other header is named.

Proofs (`proofs`, sent by the host from the user's cache folder, `$DSPARK_PATCH_CACHE/bytecode/`,
which nothing of the target writes: this script only reads them and answers the new ones). A
proof is the first 16 bytes of the sha256 of: this interpreter's identity (the bytes of its
executable and of the libpython it has mapped, its version and magic number), the optimisation
level, the source's sha256 and the .pyc's sha256. Compiling is a pure function of those, so a
.pyc whose proof was sent is what this interpreter compiles from that source, and it is not
compiled again (vLLM's 3,231 modules take seconds to compile, far longer under emulation; a
second check of the same release takes a fraction of a second). Only "" verdicts are proofs; the
header checks run every time. The answer carries `identity`, `proofs` (base64: every proof of
this run, reused or new) and `proofs_reused`; without a readable /proc/self/maps there is no identity and no proof. The
image's interpreter is trusted here as it is for every other fact this script gathers.

`own_folders` and `added_files` are the old RECORD-based rule, kept for `dspark-patch status`
when no reference exists for a release (status/assess.py); stdlib only, no upward import.
"""

import base64
import hashlib
import importlib.util
import json
import marshal
import os
import re
import stat
import sys

PTH_CAP = 64 * 1024
# references/installer.py: the dist-info files an installer adds, and the cap of each read.
METADATA_NAMES = ("INSTALLER", "REQUESTED", "direct_url.json", "uv_cache.json")
META_CAP = 64 * 1024
PYC_CAP = 64 << 20
PROOF_BYTES = 16             # a proof: the first 128 bits of its sha256 (a second preimage costs 2**128)
_PYC = re.compile(r"^(?P<stem>[^.]+)\.(?P<tag>[^.]+)(?:\.opt-(?P<opt>[12]))?\.pyc$")


def own_folders(record_paths):
    """The top-level folders a distribution installs into (its packages and dist-info)."""
    folders = set()
    for rel in record_paths:
        first, sep, _ = rel.replace("\\", "/").partition("/")
        if sep and first not in ("", ".", ".."):
            folders.add(first)
    return folders


def _bytecode_source(rel):
    """The module a bytecode path belongs to: a/__pycache__/m.cpython-311.pyc -> a/m.py, a/m.pyc -> a/m.py."""
    if not rel.endswith(".pyc"):
        return None
    folder, _, name = rel.rpartition("/")
    parent, _, last = folder.rpartition("/")
    if last == "__pycache__":
        stem = name.split(".", 1)[0]
        return f"{parent + '/' if parent else ''}{stem}.py"
    return rel[:-1]


def added_files(present, listed, folders, pth_listed):
    """Sorted paths (relative to the site folder) that count as added.

    present: files found (own folders' files and the site folder's top-level files);
    listed: paths this distribution's RECORD lists (plus files a patch legitimately adds);
    folders: `own_folders(listed)`; pth_listed: paths any distribution's RECORD lists."""
    listed = set(listed)
    added = []
    for rel in present:
        first, sep, _ = rel.partition("/")
        if not sep:
            if rel.endswith(".pth") and rel not in pth_listed and rel not in listed:
                added.append(rel)
            continue
        if first not in folders or rel in listed:
            continue
        if _bytecode_source(rel) in listed:
            continue
        added.append(rel)
    return sorted(added)


def _walk(location, folders, hash_files=True):
    """(files {rel: [sha256, size]}, others [rel], kept {rel: bytes}) of the own folders, lstat
    before any open; without `hash_files` the sha256 is None (the host hashes the same bytes, see
    the request). `kept`: the bytes of every .py and __pycache__/*.pyc of at most PYC_CAP, as
    read (and hashed) here, so that the bytecode check looks at the very bytes the host compares
    with the wheel and reads nothing twice."""
    files, others, kept = {}, [], {}
    # One buffer read into for every other file: a fresh 1 MiB bytes per read is an mmap, a page
    # fault per 4 KiB and an munmap each time (a third of the walk's time in the kernel, for
    # vLLM's 900 MB).
    buf = bytearray(1 << 18)
    view = memoryview(buf)
    for folder in sorted(folders):
        top = os.path.join(location, folder)
        try:
            mode = os.lstat(top).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(mode):
            others.append(folder)
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            rel_dir = os.path.relpath(dirpath, location).replace(os.sep, "/")
            in_cache = os.path.basename(dirpath) == "__pycache__"
            keep = []
            for name in dirnames:
                if stat.S_ISDIR(os.lstat(os.path.join(dirpath, name)).st_mode):
                    keep.append(name)
                else:
                    others.append(f"{rel_dir}/{name}")  # a symlinked folder: an entry, not a tree
            dirnames[:] = keep
            for name in filenames:
                full = os.path.join(dirpath, name)
                st = os.lstat(full)
                rel = f"{rel_dir}/{name}"
                if not stat.S_ISREG(st.st_mode):
                    others.append(rel)
                    continue
                digest = None
                whole = st.st_size <= PYC_CAP and (name.endswith(".py") or (in_cache and name.endswith(".pyc")))
                if hash_files or whole:
                    h = hashlib.sha256() if hash_files else None
                    with open(full, "rb", buffering=0) as fh:
                        data = fh.read(st.st_size + 1) if whole else b""
                        if h is not None:
                            h.update(data)
                        grew = len(data) > st.st_size  # a short read of a regular file is its end
                        while grew or not whole:
                            n = fh.readinto(buf)
                            if not n:
                                break
                            if h is not None:
                                h.update(view[:n])
                    if whole and not grew:  # a file that grew since the lstat is read again later
                        kept[rel] = data
                    if h is not None:
                        digest = h.hexdigest()
                files[rel] = [digest, st.st_size]
    return files, sorted(others), kept


def _top_level(location):
    names, pth, listed = [], {}, set()
    with os.scandir(location) as it:
        entries = sorted(it, key=lambda e: e.name)
    for entry in entries:
        st = entry.stat(follow_symlinks=False)
        if stat.S_ISDIR(st.st_mode):
            if entry.name.split(".", 1)[0] in ("sitecustomize", "usercustomize"):
                names.append(entry.name)
            if entry.name.endswith(".dist-info"):
                record = os.path.join(entry.path, "RECORD")
                try:
                    rst = os.lstat(record)
                    if stat.S_ISREG(rst.st_mode) and rst.st_size <= (32 << 20):
                        with open(record, encoding="utf-8", errors="replace") as fh:
                            for line in fh:
                                first = line.split(",", 1)[0]
                                if first.endswith(".pth") and "/" not in first:
                                    listed.add(first)
                except OSError:
                    pass
            continue
        names.append(entry.name)
        if entry.name.endswith(".pth"):
            if stat.S_ISREG(st.st_mode) and st.st_size <= PTH_CAP:
                with open(entry.path, "rb") as fh:
                    pth[entry.name] = fh.read(PTH_CAP).decode("latin-1")
            else:
                pth[entry.name] = None  # type: ignore[assignment]
    # what setuptools' distutils-precedence.pth imports at every start (references.DISTUTILS_HACK)
    hack = os.path.join(location, "_distutils_hack", "__init__.py")
    try:
        hst = os.lstat(hack)
    except OSError:
        hst = None
    if hst is not None:
        if stat.S_ISREG(hst.st_mode) and hst.st_size <= PTH_CAP:
            with open(hack, "rb") as fh:
                pth["_distutils_hack/__init__.py"] = fh.read(PTH_CAP).decode("latin-1")
        else:
            pth["_distutils_hack/__init__.py"] = None  # type: ignore[assignment]
    return names, pth, sorted(listed)


def _read_regular(path, cap):
    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
        return None
    with open(path, "rb") as fh:
        # What read(cap + 1) gives, without asking for a cap-sized buffer for every small file.
        data = fh.read(st.st_size + 1)
        if len(data) > st.st_size:  # it grew since the lstat: read on to the cap, as before
            data += fh.read(cap + 1 - len(data))
        return data


def _header_loads(header, source, source_path):
    """Would this interpreter load bytecode with this header for this source? '' yes, else why not."""
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return "was not written by this interpreter"
    flags = int.from_bytes(header[4:8], "little")
    if flags & ~0b11:
        return f"has unknown flags {flags:#x}"
    if flags & 0b1:
        if flags & 0b10 and header[8:16] != importlib.util.source_hash(source):
            return "is stale: its source hash does not match the file"
        return ""
    st = os.stat(source_path)
    if header[8:12] != (int(st.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little") or \
            header[12:16] != (len(source) & 0xFFFFFFFF).to_bytes(4, "little"):
        return "is stale: timestamp bytecode does not match the file"
    return ""


def _identity():
    """sha256 of what compiles here: the executable's bytes, the libpython mapped in, the version
    and magic number; None where that cannot be known (no /proc/self/maps)."""
    digest = hashlib.sha256()
    digest.update(sys.version.encode() + b"\0" + importlib.util.MAGIC_NUMBER + b"\0")
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            mapped = {line.split(None, 5)[5].strip() for line in fh if len(line.split(None, 5)) == 6}
    except OSError:
        return None
    executable = os.path.realpath(sys.executable)
    libs = sorted(p for p in mapped if os.path.basename(p).startswith("libpython") and p.startswith("/"))
    for path in [executable, *libs]:
        try:
            with open(path, "rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(block)
        except OSError:
            return None
        digest.update(b"\0" + path.encode() + b"\0")
    return digest.hexdigest()


class _Proofs:
    """The proofs the host sent (`proofs`: base64 of 16-byte keys), and the ones made here."""

    def __init__(self, sent):
        self.identity = _identity() if sent is not None else None
        self.known = set()
        self.held = set()    # every proof of this run: reused or new
        self.reused = 0
        if self.identity is None:
            return
        try:
            raw = base64.b64decode(sent, validate=True)
        except (ValueError, TypeError):
            raw = b""
        self.known = {raw[i:i + PROOF_BYTES] for i in range(0, len(raw) - len(raw) % PROOF_BYTES, PROOF_BYTES)}

    def key(self, opt, source, data, digests=(None, None)):
        """The proof of `data` (a .pyc) compiled from `source`; `digests`: their sha256 (hex)
        where the walk already hashed these very bytes."""
        if self.identity is None:
            return None
        source_hex = digests[0] or hashlib.sha256(source).hexdigest()
        data_hex = digests[1] or hashlib.sha256(data).hexdigest()
        return hashlib.sha256(f"{self.identity}\0{opt}\0{source_hex}\0{data_hex}".encode()).digest()[:PROOF_BYTES]

    def answer(self):
        if self.identity is None:
            return {}
        return {"identity": self.identity, "proofs_reused": self.reused,
                "proofs": base64.b64encode(b"".join(sorted(self.held))).decode("ascii")}


_NO_PROOFS = _Proofs(None)


def check_pyc(location, pyc_rel, source_rel, opt, *, patched, proofs=_NO_PROOFS, walked=None):
    """'' when the .pyc this interpreter would load has the code of its source; else why not.
    `walked`: (files, kept) of the walk, whose bytes (and their sha256) are used where it kept
    them; the others are read here."""
    pyc = os.path.join(location, pyc_rel)
    source_path = os.path.join(location, source_rel)
    files, kept = walked or ({}, {})
    source = kept.get(source_rel)
    data = kept.get(pyc_rel)
    digests = (files[source_rel][0] if source is not None else None, files[pyc_rel][0] if data is not None else None)
    if source is None:
        source = _read_regular(source_path, PYC_CAP)
    if data is None:
        data = _read_regular(pyc, PYC_CAP)
    if source is None or data is None:
        return "is not a regular file (or is too large)"
    why = _header_loads(data[:16], source, source_path)
    if why:
        return why if patched else ""   # never loaded: harmless, except where the tool wrote it
    flags = int.from_bytes(data[4:8], "little")
    if patched and not flags & 0b1:
        return "is timestamp bytecode, expected checked-hash"
    if patched and not flags & 0b10:
        return "is unchecked-hash bytecode (never revalidated)"
    key = proofs.key(opt, source, data, digests)
    if key is not None and key in proofs.known:
        proofs.reused += 1
        proofs.held.add(key)
        return ""
    try:
        fresh = compile(source, source_path, "exec", dont_inherit=True, optimize=opt)
    except (SyntaxError, ValueError) as exc:
        return f"has no source to match: {source_rel} does not compile ({type(exc).__name__})"
    exact = marshal.dumps(fresh) == data[16:]
    try:
        loaded = fresh if exact else marshal.loads(data[16:])
    except (EOFError, ValueError, TypeError):
        return "is not valid bytecode"
    if exact or loaded == fresh:
        if key is not None:
            proofs.held.add(key)
        return ""
    if _same_shape(loaded, fresh):
        return (f"does not hold the code of {source_rel}: its names and constants are the source's, its instructions "
                f"are not what {sys.executable} ({sys.version.split()[0]}) compiles (another release of the "
                f"interpreter wrote it, or it was forged; rewrite it with the image's own python: "
                f"{sys.executable} -m compileall -f {source_path})")
    return f"does not hold the code of {source_rel} (recompiled with this interpreter and compared)"


def _same_shape(a, b):
    """Everything of two code objects but their instructions, line and exception tables.

    Another patch release of the interpreter (same magic number) can compile a function to other
    instructions (3.11.2 and 3.11.7 do, for a few of vLLM's): the message then says how to
    rewrite the bytecode; it is no less a finding (forged instructions look the same)."""
    if type(a) is not type(b):
        return False
    if not hasattr(a, "co_code"):
        return a == b
    for attr in ("co_name", "co_qualname", "co_names", "co_varnames", "co_freevars", "co_cellvars",
                 "co_argcount", "co_posonlyargcount", "co_kwonlyargcount", "co_flags", "co_firstlineno"):
        if getattr(a, attr, None) != getattr(b, attr, None):
            return False
    if len(a.co_consts) != len(b.co_consts):
        return False
    return all(_same_shape(a.co_consts[i], b.co_consts[i]) for i in range(len(a.co_consts)))


def check_bytecode_all(location, files, patched, proofs=_NO_PROOFS, kept=None):
    tag = sys.implementation.cache_tag
    results = {}
    for rel in sorted(files):
        folder, _, name = rel.rpartition("/")
        parent, _, last = folder.rpartition("/")
        found = _PYC.match(name)
        if last != "__pycache__" or found is None or found.group("tag") != tag:
            continue
        source_rel = f"{parent + '/' if parent else ''}{found.group('stem')}.py"
        if source_rel not in files:
            continue  # sourceless: never loaded from __pycache__; the host counts it as added
        opt = int(found.group("opt") or 0)
        results[rel] = check_pyc(location, rel, source_rel, opt, patched=source_rel in patched, proofs=proofs,
                                 walked=(files, kept or {}))
    for source_rel in patched:  # the tool compiled these: their bytecode must be there
        pyc = importlib.util.cache_from_source(source_rel)
        if source_rel in files and pyc not in results:
            results[pyc] = "is missing"
    return results


def installer_files(location, files, rows):
    """The bytes (latin-1 text) of every top-level dist-info's files named like installer
    metadata (None: over META_CAP), and per console-script RECORD row the file it names: its
    text, None where there is none, or {"why": …} where it is not a small regular file
    (references/installer.py judges them; nothing here is trusted)."""
    metadata = {}
    for rel in files:
        folder, _, name = rel.rpartition("/")
        if name in METADATA_NAMES and folder.endswith(".dist-info") and "/" not in folder:
            data = _read_regular(os.path.join(location, rel), META_CAP)
            metadata[rel] = None if data is None or len(data) > META_CAP else data.decode("latin-1")
    scripts = {}  # type: dict
    for row in rows:
        path = os.path.normpath(os.path.join(location, row))
        try:
            st = os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            scripts[row] = None
            continue
        except OSError as exc:
            scripts[row] = {"why": f"unreadable ({exc.strerror})"}
            continue
        if stat.S_ISLNK(st.st_mode):
            scripts[row] = {"why": "a symlink"}
        elif not stat.S_ISREG(st.st_mode):
            scripts[row] = {"why": "not a regular file"}
        else:
            data = _read_regular(path, META_CAP)
            scripts[row] = {"why": f"over {META_CAP} bytes"} if data is None or len(data) > META_CAP \
                else data.decode("latin-1")
    return metadata, scripts


def main(request):
    location = request["location"]
    files, others, kept = _walk(location, request["folders"], request.get("hash", True))
    top_level, pth, pth_listed = _top_level(location)
    patched = set(request.get("patched", []))
    proofs = _Proofs(request.get("proofs"))
    bytecode = check_bytecode_all(location, files, patched, proofs, kept)
    metadata, scripts = installer_files(location, files, request.get("scripts", []))
    return {"files": files, "others": others, "top_level": top_level, "pth": pth, "pth_listed": pth_listed,
            "bytecode": bytecode, "cache_tag": sys.implementation.cache_tag, "metadata": metadata,
            "scripts": scripts, **proofs.answer()}


if __name__ == "__main__":
    json.dump(main(json.loads(sys.argv[1])), sys.stdout)
