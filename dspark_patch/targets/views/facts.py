"""What a read-only view keeps of one file of the distribution's own folders, read once as a stream.

Every file: its sha256. A `.py` source (up to SOURCE_CAP): its size and importlib's source hash
(under this host's magic number), for the checked-hash bytecode header check; a `.pyc`: its
first 16 bytes (the header). A path in `retain` (the files known patch sets change, and their
bytecode): its bytes, so `status` can recompile them (status/bytecode.py). Bounded: nothing but
the kept files and 16-byte headers is held.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

SOURCE_CAP = 16 << 20   # a larger .py is hashed but gets no source hash (its bytecode: not verified)
RETAIN_CAP = 16 << 20


@dataclass(frozen=True, slots=True)
class FileFacts:
    sha256: str
    size: int
    source_hash: bytes | None = None   # .py: importlib.util.source_hash of its bytes
    header: bytes | None = None        # .pyc: its first 16 bytes
    data: bytes | None = None          # a kept file's bytes


def read_facts(rel: str, chunks: Iterable[bytes | memoryview], *, retain: bool = False) -> FileFacts:
    """Facts of one file from its bytes in `chunks` (a chunk may be a view into a buffer that is
    reused for the next one: what is held is copied)."""
    digest = hashlib.sha256()
    size = 0
    head = b""
    whole: list[bytes] | None = [] if rel.endswith(".py") or retain else None
    for chunk in chunks:
        digest.update(chunk)
        if len(head) < 16:
            head += bytes(chunk[:16 - len(head)])
        size += len(chunk)
        if whole is not None:
            whole.append(bytes(chunk))
            if size > max(SOURCE_CAP, RETAIN_CAP):
                whole = None
    data = b"".join(whole) if whole is not None else None
    return FileFacts(
        sha256=digest.hexdigest(), size=size,
        source_hash=importlib.util.source_hash(data) if rel.endswith(".py") and data is not None and size <= SOURCE_CAP else None,
        header=head if rel.endswith(".pyc") else None,
        data=data if retain and data is not None and size <= RETAIN_CAP else None,
    )


def file_chunks(fileno: int, buf: bytearray) -> Iterator[memoryview]:
    """An open file's bytes as views into `buf`, which each next chunk overwrites (one buffer for
    a whole tree: a fresh bytes object per read is an mmap, page faults and an munmap each time)."""
    view = memoryview(buf)
    while True:
        n = os.readv(fileno, [buf])
        if not n:
            return
        yield view[:n]
