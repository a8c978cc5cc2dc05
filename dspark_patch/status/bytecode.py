"""What `status`, which runs nothing, can say about a site folder's cached bytecode.

For each `__pycache__/m.<tag>[.opt-N].pyc` of the image's interpreter whose source is there:
- its header must match the source: the source hash for checked-hash bytecode (computable here
  when the .pyc's magic number is this host's), mtime and size for timestamp bytecode; a
  mismatch is a finding, never clean;
- the bytecode of the files known patch sets change (`kept` bytes) is recompiled when the
  magic number is this host's, in a fresh isolated process of this host's interpreter, and
  compared: bytes first, then code objects (see _COMPARE). `compile` parses and `marshal`
  reads; nothing of the target is executed;
- every other .pyc is matched by header only: "bytecode not verified" (verify recompiles them
  all with the image's own interpreter).
"""

from __future__ import annotations

import _imp
import importlib.util
import re
import threading
from dataclasses import dataclass

from ..references import bytecode_source
from ..targets.views.site_files import SiteFiles

_OPT = re.compile(r"\.opt-([12])\.pyc$")


@dataclass(frozen=True, kw_only=True)
class BytecodeCheck:
    findings: tuple[str, ...]
    not_verified: int
    proven: int
    # kept .pyc (the patched modules') of another Python than this host's that no interpreter of
    # that minor recompiled: their header alone proves nothing (verify fails on them)
    unrecompiled: tuple[str, ...] = ()


# The magic number of each CPython's bytecode (importlib.util.MAGIC_NUMBER, little-endian, then
# b"\r\n"): the key of its source hash, and what tells whose bytecode a .pyc is.
MAGIC = {"3.8": 3413, "3.9": 3425, "3.10": 3439, "3.11": 3495, "3.12": 3531, "3.13": 3571}


def minor_magic(minor: str | None) -> bytes | None:
    number = MAGIC.get(minor or "")
    return None if number is None else number.to_bytes(2, "little") + b"\r\n"


def cache_tag(python: str | None) -> str | None:
    return f"cpython-{python.replace('.', '')}" if python else None


# Run in a fresh `python -I -S -B` (this host's interpreter, nothing of the target on its path):
# compile each kept source and compare with its .pyc, bytes first, then as code objects. The
# marshal format writes a back-reference for an object only when its reference count is above
# one, so the same source can marshal differently in two processes; `==` on code objects
# compares bytecode, constants, names and line tables (not co_filename). The .pyc's data is
# only unmarshalled, never executed; a crash of this process is a finding, never a verdict.
_COMPARE = r"""
import base64, importlib._bootstrap_external as be, json, marshal, sys
out = []
for item in json.loads(sys.stdin.read()):
    source, pyc = base64.b64decode(item["source"]), base64.b64decode(item["pyc"])
    try:
        code = compile(source, item["filename"], "exec", dont_inherit=True, optimize=item["opt"])
    except (SyntaxError, ValueError):
        out.append("source does not compile"); continue
    fresh = bytes(be._code_to_hash_pyc(code, pyc[8:16], bool(item["checked"])))
    if fresh == pyc:
        out.append(""); continue
    try:
        loaded = marshal.loads(pyc[16:])
    except (EOFError, ValueError, TypeError):
        out.append("not valid bytecode"); continue
    out.append("" if pyc[:16] == fresh[:16] and loaded == code else "code differs")
print(json.dumps(out))
"""


def asked_magic(python: str) -> bytes | None:
    """The bytecode magic number (importlib.util.MAGIC_NUMBER) of the interpreter at `python`,
    asked of it in a fresh isolated process; None where it does not run or answer."""
    import subprocess

    try:
        done = subprocess.run([python, "-I", "-S", "-B", "-c", "import importlib.util as u; print(u.MAGIC_NUMBER.hex())"],
                              capture_output=True, text=True, timeout=60, cwd="/", check=False)
        return bytes.fromhex(done.stdout.strip()) if done.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return None


def interpreter_for(magic: bytes, minor: str, named: str | None = None) -> str | None:
    """An interpreter on this host whose bytecode is `magic`'s (Python `minor`): this host's own,
    else `named` (the user's --python, which must be one), else `python<minor>` on PATH."""
    import shutil
    import sys

    if importlib.util.MAGIC_NUMBER == magic:
        return sys.executable
    if named is not None:
        return named if asked_magic(named) == magic else None
    found = shutil.which(f"python{minor}")
    return found if found is not None and asked_magic(found) == magic else None


def compare(items: list[dict], python: str | None = None) -> list[str]:
    """Per item (source, pyc, filename, opt, checked): '' when the .pyc holds its source's code as
    `python` (default: this host's) compiles it, else why not (see _COMPARE). The images of a
    fleet keep the same patched files: the same bytes are compiled once per process (an answer
    that is not one, a crash or a timeout, is not kept)."""
    import base64
    import json
    import sys

    if not items:
        return []
    payload = json.dumps([{**i, "source": base64.b64encode(i["source"]).decode(), "pyc": base64.b64encode(i["pyc"]).decode()}
                          for i in items])
    key = (python or sys.executable, payload)
    with _COMPARING.setdefault(key, threading.Lock()):  # the tags read at once wait for one compile
        found = _compare_once(key, payload, python, len(items))
    _COMPARING.pop(key, None)
    return found


def _compare_once(key: tuple[str, str], payload: str, python: str | None, count: int) -> list[str]:
    import json
    import subprocess
    import sys

    known = _COMPARED.get(key)
    if known is not None:
        return list(known)
    try:
        done = subprocess.run([python or sys.executable, "-I", "-S", "-B", "-c", _COMPARE], input=payload.encode(),
                              capture_output=True, timeout=300, cwd="/")
        result = json.loads(done.stdout)
        if done.returncode == 0 and isinstance(result, list) and len(result) == count:
            found = [str(r) for r in result]
            _COMPARED[key] = tuple(found)
            for old in list(_COMPARED)[:-64]:  # the oldest (another thread may evict the same one)
                _COMPARED.pop(old, None)
            return found
    except (subprocess.TimeoutExpired, ValueError, OSError):
        pass
    return ["could not be compared"] * count


_COMPARING: dict[tuple[str, str], threading.Lock] = {}
_COMPARED: dict[tuple[str, str], tuple[str, ...]] = {}


def check(site: SiteFiles, python: str | None = None) -> BytecodeCheck:
    """`python`: an interpreter of the image's minor where it is not this host's
    (`interpreter_for`): the kept bytecode is then recompiled by it."""
    tag = cache_tag(site.python)
    image_magic = minor_magic(site.python)
    other = python is not None and image_magic is not None and image_magic != importlib.util.MAGIC_NUMBER
    findings: list[str] = []
    unrecompiled: list[str] = []
    not_verified = proven = 0
    to_compare: list[tuple[str, str, dict]] = []
    for pyc, header in sorted(site.pyc_headers.items()):
        source = bytecode_source(pyc)
        if source is None or source not in site.sources:
            continue  # sourceless bytecode is `added` (references.compare)
        name = pyc.rsplit("/", 1)[-1]
        if tag is not None and f".{tag}." not in name:
            continue  # another interpreter's: this one never loads it
        if len(header) < 16:
            findings.append(f"{pyc}: truncated bytecode header")
            continue
        mtime, size, source_hash = site.sources[source]
        flags = int.from_bytes(header[4:8], "little")
        ours = header[:4] == importlib.util.MAGIC_NUMBER
        kept = pyc in site.retained and source in site.retained
        if flags & 0b1:
            # the source hash its header must name: this host's own (kept for every source), or,
            # for a kept module of the image's other minor, one computed under its magic number
            other_minor = not ours and kept and header[:4] == image_magic
            expected = source_hash if ours else None
            if other_minor and other:
                expected = _imp.source_hash(int.from_bytes(header[:4], "little"), site.retained[source])
            if expected is None:
                if other_minor:
                    unrecompiled.append(pyc)   # no interpreter of that minor on this host
                not_verified += 1
            elif header[8:16] != expected:
                findings.append(f"{pyc}: checked-hash bytecode whose source hash is not {source}'s")
            elif kept:
                opt = _OPT.search(name)
                to_compare.append((pyc, source, {"source": site.retained[source], "pyc": site.retained[pyc],
                                                 "filename": f"{site.location}/{source}",
                                                 "opt": int(opt.group(1)) if opt else 0, "checked": bool(flags & 0b10)}))
            else:
                not_verified += 1
        elif flags == 0:
            if header[8:12] != (mtime & 0xFFFFFFFF).to_bytes(4, "little") or \
                    header[12:16] != (size & 0xFFFFFFFF).to_bytes(4, "little"):
                findings.append(f"{pyc}: timestamp bytecode whose mtime or size is not {source}'s")
            else:
                not_verified += 1
        else:
            findings.append(f"{pyc}: bytecode header with unknown flags {flags:#x}")
    done = compare([item for _, _, item in to_compare], python if other else None)
    for (pyc, source, _), why in zip(to_compare, done, strict=True):
        if why:
            findings.append(f"{pyc}: its code is not {source}'s (recompiled here and compared: {why})")
        else:
            proven += 1
    return BytecodeCheck(findings=tuple(sorted(findings)), not_verified=not_verified, proven=proven,
                         unrecompiled=tuple(unrecompiled))


def not_verified_line(count: int) -> str:
    return (f"bytecode not verified: {count} .pyc file(s) match their sources by header only "
            "(status runs nothing; dspark-patch verify recompiles them with the image's interpreter)")
