"""What `status`, which runs nothing, can say about a site folder's cached bytecode.

For each `__pycache__/m.<tag>[.opt-N].pyc` of the image's interpreter whose source is there:
- its header must match the source: the source hash for checked-hash bytecode (computable here
  when the .pyc's magic number is this host's), mtime and size for timestamp bytecode; a
  mismatch is a finding, never clean;
- the bytecode of the files known patch sets change (`kept` bytes) is recompiled here when the
  magic number is this host's, and compared byte for byte (checked-hash bytecode is
  deterministic: the same source, path and interpreter give the same bytes). `compile` parses,
  it never runs the target's code;
- every other .pyc is matched by header only: "bytecode not verified" (verify recompiles them
  all with the image's own interpreter).
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass

from ..references import bytecode_source
from ..targets.sitefiles import SiteFiles

_OPT = re.compile(r"\.opt-([12])\.pyc$")


@dataclass(frozen=True, kw_only=True)
class BytecodeCheck:
    findings: tuple[str, ...]
    not_verified: int
    proven: int


def cache_tag(python: str | None) -> str | None:
    return f"cpython-{python.replace('.', '')}" if python else None


def _recompiled(source: bytes, filename: str, pyc_name: str, source_hash: bytes, checked: bool) -> bytes | None:
    from importlib import _bootstrap_external

    opt = _OPT.search(pyc_name)
    try:
        code = compile(source, filename, "exec", dont_inherit=True, optimize=int(opt.group(1)) if opt else 0)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    return bytes(_bootstrap_external._code_to_hash_pyc(code, source_hash, checked))  # type: ignore[attr-defined]


def check(site: SiteFiles) -> BytecodeCheck:
    tag = cache_tag(site.python)
    findings: list[str] = []
    not_verified = proven = 0
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
        if flags & 0b1:
            if not ours or source_hash is None:
                not_verified += 1
            elif header[8:16] != source_hash:
                findings.append(f"{pyc}: checked-hash bytecode whose source hash is not {source}'s")
            elif pyc in site.kept and source in site.kept:
                fresh = _recompiled(site.kept[source], f"{site.location}/{source}", name, source_hash, bool(flags & 0b10))
                if fresh is not None and fresh == site.kept[pyc]:
                    proven += 1
                else:
                    findings.append(f"{pyc}: its code is not {source}'s (recompiled here, compared byte for byte)")
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
    return BytecodeCheck(findings=tuple(findings), not_verified=not_verified, proven=proven)


def not_verified_line(count: int) -> str:
    return (f"bytecode not verified: {count} .pyc file(s) match their sources by header only "
            "(status runs nothing; dspark-patch verify recompiles them with the image's interpreter)")
