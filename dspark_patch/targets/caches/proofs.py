"""Bytecode proofs kept on this machine (inside/integrity.py says what a proof is and why a kept
one is as good as a compile): `$DSPARK_PATCH_CACHE/bytecode/`.

- `by-target/<sha256 of the target's key>`: the interpreter identity a target answered last time
  (an image id and its python, or a local python with its inode, size and mtime); `apply` names
  its result image's with its source's (`carry`: its layer holds no interpreter). Only a hint: a
  wrong one means no proof matches, and the check compiles as it would with none. There is no
  hint for a target never checked here.
- `<identity>/<distribution>-<version>`: that interpreter's proofs for that release, 16 bytes each.

Every file is sealed with this machine's cache key (targets/caches/seal.py): proofs planted, copied
from another machine or another release's file, or appended to are not sent (noted).

What is sent is bounded (`SEND_CAP`: the argument a python is started with must stay well under
Linux's 128 KiB per argument); a file that cannot be read is no proofs; files are replaced
atomically, so two runs at once lose at most the proofs of one of them.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import re
from pathlib import Path

from ...inside.answers import IntegrityAnswer
from ..base import Distribution, TargetInfo
from . import cachedir, seal

PROOF_BYTES = 16
SEND_CAP = 100 << 10         # base64 characters sent at most: 4,800 proofs (vLLM 0.33.0 has 3,231 .pyc)
_IDENTITY = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"[^A-Za-z0-9._-]")


def _root() -> Path:
    return cachedir.home() / "bytecode"


def target_key(info: TargetInfo, dist: Distribution) -> str:
    if info.kind == "image" and info.id:
        return f"image\0{info.id}\0{dist.python}"
    python = os.path.realpath(dist.python)
    try:
        st = os.stat(python)
    except OSError:
        return ""
    return f"local\0{python}\0{st.st_ino}\0{st.st_size}\0{st.st_mtime_ns}"


def _hint_file(key: str) -> Path:
    return _root() / "by-target" / hashlib.sha256(key.encode()).hexdigest()


def _proofs_file(identity: str, dist: Distribution) -> Path:
    return _root() / identity / _NAME.sub("_", f"{dist.name}-{dist.version}")


def _read(path: Path) -> bytes | None:
    """The body of a sealed file of the proofs folder, or None."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    return seal.unwrap("bytecode", path.relative_to(_root()).as_posix(), raw)


def _write(path: Path, body: bytes) -> None:
    sealed = seal.wrap("bytecode", path.relative_to(_root()).as_posix(), body)
    if sealed is not None:
        cachedir.write_atomic(path, sealed)


def _identity_of(key: str) -> str | None:
    try:
        identity = (_read(_hint_file(key)) or b"").decode("ascii").strip()
    except UnicodeDecodeError:
        return None
    return identity if _IDENTITY.match(identity) else None


def to_send(info: TargetInfo, dist: Distribution) -> str:
    """base64 of the proofs the target's interpreter made for this release, as far as known."""
    key = target_key(info, dist)
    identity = _identity_of(key) if key else None
    if identity is None:
        return ""
    raw = (_read(_proofs_file(identity, dist)) or b"")[: SEND_CAP * 3 // 4]
    return base64.b64encode(raw[: len(raw) - len(raw) % PROOF_BYTES]).decode("ascii")


def carry(source: TargetInfo, result: TargetInfo, dist: Distribution) -> None:
    """Name `result`'s interpreter as `source`'s: `apply` made `result` from `source` with one
    layer of vLLM's files (no interpreter in it). Never fails a run."""
    key, new = target_key(source, dist), target_key(result, dist)
    identity = _identity_of(key) if key and new else None
    if identity is not None:
        with contextlib.suppress(OSError):
            _write(_hint_file(new), identity.encode("ascii"))


def _records(data: bytes) -> set[bytes]:
    return {data[i:i + PROOF_BYTES] for i in range(0, len(data) - len(data) % PROOF_BYTES, PROOF_BYTES)}


def put(info: TargetInfo, dist: Distribution, answer: IntegrityAnswer) -> None:
    """Store what the interpreter answered (its identity, this run's proofs). Never fails a run."""
    identity = answer.identity
    held = answer.proofs
    key = target_key(info, dist)
    if not key or identity is None or not _IDENTITY.match(identity) or held is None:
        return
    try:
        run = _records(base64.b64decode(held, validate=True))
    except ValueError:
        return
    try:
        _write(_hint_file(key), identity.encode("ascii"))
        if not run:
            return
        path = _proofs_file(identity, dist)
        old = _records(_read(path) or b"")
        if run <= old:
            return
        merged = old | run
        # More than is ever sent: keep this run's own (a whole tree's, the likeliest next one).
        _write(path, b"".join(sorted(merged if len(merged) * PROOF_BYTES * 4 // 3 <= SEND_CAP else run)))
    except OSError:
        return

