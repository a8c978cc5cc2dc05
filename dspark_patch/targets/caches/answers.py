"""Answers an image gave to a read-only check, kept on this machine by image id:
`$DSPARK_PATCH_CACHE/answers/<sha256 of the key>` (what makes a repeated apply as cheap as a hand-made build).

An image id is the digest of the image's config, and the config names every layer by the digest
of its uncompressed bytes (diff_id): a container made from that id holds the same files every
time. A check that only reads them (locate, the integrity walk), run by the same script with the
same interpreter, arguments and engine, therefore answers the same, and its kept answer is as
good as running it again. What this trusts is what running the image trusts: the engine's content
store. As Trivy keeps its analysis by image id and layer digest, a second `apply`, `verify` or
`probe` of one image runs neither check again (`kept_answer` in the audit report says so).

- **Key.** What makes the answer: the image id, the engine's address, the script's own source
  (another version of the tool asks again), the interpreter and every argument. It is stored in
  the entry and compared on load.
- **When.** Only answers read from a container nothing was written into yet (the caller says so).
- **Seal.** An entry is believed only under this machine's cache key (targets/caches/seal.py): one
  copied from another image's name, rewritten or planted is a miss and a note.
- **Damage.** A torn, foreign or unreadable entry is a miss, never an error; writes are atomic.
- **Shape.** Its reader decodes an entry as it decodes a fresh answer (inside/answers.py): one that
  is not of the script's shape is a miss too.
- **Bound.** At most `MAX_ENTRIES` entries; after a write over it the least recently used go.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from . import cachedir, seal

MAX_ENTRIES = 256
_MAGIC = "dspark-patch kept answer 1"


def _root() -> Path:
    return cachedir.home() / "answers"


def answer_key(*, image_id: str, engine: str, script: str, python: str, args: list[Any]) -> str:
    """The key of one check of one image (a JSON text: every part it is made of, in order)."""
    return json.dumps([_MAGIC, image_id, engine, hashlib.sha256(script.encode("utf-8")).hexdigest(), python, args],
                      separators=(",", ":"))


def _file(key: str) -> Path:
    return _root() / hashlib.sha256(key.encode("utf-8")).hexdigest()


def get(key: str) -> Any | None:
    """The answer kept under `key`, or None (none kept, or an entry that is not one)."""
    path = _file(key)
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    body = seal.unwrap("answers", path.name, raw)
    try:
        doc = json.loads(body) if body is not None else None
    except ValueError:
        return None
    if not isinstance(doc, dict) or doc.get("key") != key or "answer" not in doc:
        return None
    with contextlib.suppress(OSError):
        os.utime(path)  # used: the last to go
    return doc["answer"]


def put(key: str, answer: Any) -> None:
    """Store `answer` under `key`. Never fails a run: a cache that cannot be written is no cache."""
    path = _file(key)
    try:
        sealed = seal.wrap("answers", path.name, json.dumps({"key": key, "answer": answer}, separators=(",", ":")).encode())
        if sealed is None:
            return
        cachedir.write_atomic(path, sealed)
        _prune()
    except (OSError, TypeError, ValueError):
        return


def _prune() -> None:
    entries = []
    with os.scandir(_root()) as found:
        for entry in found:
            if not entry.name.startswith(".") and entry.is_file(follow_symlinks=False):
                entries.append((entry.stat(follow_symlinks=False).st_mtime, entry.path))
    for _, path in sorted(entries)[: max(0, len(entries) - MAX_ENTRIES)]:
        with contextlib.suppress(OSError):
            os.unlink(path)
