"""Bytecode proofs kept on this machine (inside/integrity.py says what a proof is and why a kept
one is as good as a compile): `$DSPARK_PATCH_CACHE/bytecode/`.

- `by-target/<sha256 of the target's key>`: the interpreter identity a target answered last time
  (an image id and its python, or a local python with its inode, size and mtime), and the last
  one that checked each release (a patched image is a new id with its source's python). Only a
  hint: a wrong one means no proof matches, and the check compiles as it would with none.
- `<identity>/<distribution>-<version>`: that interpreter's proofs for that release, 16 bytes each.

What is sent is bounded (`SEND_CAP`: the argument a python is started with must stay well under
Linux's 128 KiB per argument); a file that cannot be read is no proofs; files are replaced
atomically, so two runs at once lose at most the proofs of one of them.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
from pathlib import Path

from . import cachedir
from .base import Distribution, TargetInfo

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


def _release_key(dist: Distribution) -> str:
    return f"release\0{dist.name}\0{dist.version}"


def _hint_file(key: str) -> Path:
    return _root() / "by-target" / hashlib.sha256(key.encode()).hexdigest()


def _proofs_file(identity: str, dist: Distribution) -> Path:
    return _root() / identity / _NAME.sub("_", f"{dist.name}-{dist.version}")


def to_send(info: TargetInfo, dist: Distribution) -> str:
    """base64 of the proofs the target's interpreter made for this release, as far as known."""
    key = target_key(info, dist)
    if not key:
        return ""
    # this target's interpreter, else the last one that checked this release (a patched image
    # is a new image id with its source's interpreter)
    for hint in (_hint_file(key), _hint_file(_release_key(dist))):
        try:
            identity = hint.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if not _IDENTITY.match(identity):
            return ""
        try:
            raw = _proofs_file(identity, dist).read_bytes()[: SEND_CAP * 3 // 4]
        except OSError:
            return ""
        return base64.b64encode(raw[: len(raw) - len(raw) % PROOF_BYTES]).decode("ascii")
    return ""


def _records(data: bytes) -> set[bytes]:
    return {data[i:i + PROOF_BYTES] for i in range(0, len(data) - len(data) % PROOF_BYTES, PROOF_BYTES)}


def keep(info: TargetInfo, dist: Distribution, answer: dict) -> None:
    """Store what the interpreter answered (its identity, this run's proofs). Never fails a run."""
    identity = answer.get("identity")
    held = answer.get("proofs")
    key = target_key(info, dist)
    if not key or not isinstance(identity, str) or not _IDENTITY.match(identity) or not isinstance(held, str):
        return
    try:
        run = _records(base64.b64decode(held, validate=True))
    except ValueError:
        return
    try:
        for hint in (_hint_file(key), _hint_file(_release_key(dist))):
            cachedir.write_atomic(hint, identity.encode("ascii"))
        if not run:
            return
        path = _proofs_file(identity, dist)
        try:
            old = _records(path.read_bytes())
        except OSError:
            old = set()
        if run <= old:
            return
        merged = old | run
        # More than is ever sent: keep this run's own (a whole tree's, the likeliest next one).
        cachedir.write_atomic(path, b"".join(sorted(merged if len(merged) * PROOF_BYTES * 4 // 3 <= SEND_CAP else run)))
    except OSError:
        return

