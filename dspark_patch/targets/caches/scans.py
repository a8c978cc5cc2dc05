"""Layer scans kept on disk by the layer's uncompressed digest (its diff_id): what makes `status` of a fleet cheap.

What is kept is a `LayerScan` (the members the status predicate keeps, with their hashes and
small bytes, every symlink, the whiteouts and opaque folders, one key per member), never the
layer itself, so the cache stays small: the fixture's 2 GB of layers cache in a few MB.

- **Key.** An entry is named by the sha256 of the predicate's identity and the diff_id: a scan
  kept for another predicate (another distribution, other patch sets' paths, another version of
  the reader, another host python's magic number: a scan's source hashes are under it) is another
  entry and is never reused. The identity is also stored in the entry
  and checked on load.
- **Trust.** Only a scan of a layer whose bytes were checked against its digest is stored (the
  callers: registry route and save route hash what they scan). An entry is its seal under this
  machine's cache key (targets/caches/seal.py: an HMAC of the entry's name and body), then the body; a
  torn, truncated, foreign, copied or rewritten file is a miss (noted when its seal fails), never
  an error. Without a usable key nothing is kept or read.
- **Concurrency.** Written to a temporary file in the cache folder, then renamed into place
  (atomic on one file system): a reader sees the old entry, the new one or none. Two runs
  writing one entry write the same bytes.
- **Bound.** At most `max_bytes` in all (`--cache-max`, `DSPARK_PATCH_CACHE_MAX`, default
  1 GiB); after a write over the bound the least recently used entries (a hit touches its mtime)
  are removed until 90% of it is left. Nothing is written outside the cache folder.
"""

from __future__ import annotations

import array
import base64
import contextlib
import hashlib
import importlib.util
import json
import os
import re
import zlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import BadInput
from ..layers.scan import Entry, LayerScan
from . import cachedir, seal

ENV_ROOT = cachedir.ENV_ROOT
ENV_MAX = "DSPARK_PATCH_CACHE_MAX"
DEFAULT_MAX = 1 << 30
MAGIC = b"dspark-patch layer scan 3\n"
_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_SIZE = re.compile(r"^\s*(\d+)\s*([kmgt]?)i?b?\s*$", re.IGNORECASE)


def default_root() -> Path:
    """`scans/` in the project's cache folder, $DSPARK_PATCH_CACHE (default ~/.cache/dspark-patch,
    where the wheels and images of scripts/ and tests/ are kept too)."""
    return cachedir.home() / "scans"


def parse_size(text: str, what: str) -> int:
    """`500M`, `2G`, `1048576` -> bytes; anything else is bad input."""
    found = _SIZE.match(text)
    if found is None:
        raise BadInput(f"{what} {text!r} is not a size", hint="write bytes, or a number with K, M, G or T (e.g. 2G)")
    return int(found[1]) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[found[2].lower()]


class ScanCache:
    """`get(diff_id)` -> LayerScan or None; `put(diff_id, scan)`. `hits`/`stores` count this run's."""

    def __init__(self, root: Path, *, identity: str, max_bytes: int = DEFAULT_MAX) -> None:
        self.root = root
        self.identity = identity
        self.max_bytes = max_bytes
        self.hits = 0
        self.stores = 0
        self._total: int | None = None   # bytes in the cache as this run last counted them
        # The scans this run read, by diff_id: read and checked once however many images share
        # the layer, and the same object each time (merge reuses a shared bottom).
        self._held: dict[str, LayerScan] = {}

    @classmethod
    def from_env(cls, identity: str, max_bytes: int | None = None) -> ScanCache:
        if max_bytes is None:
            text = os.environ.get(ENV_MAX, "").strip()
            max_bytes = parse_size(text, ENV_MAX) if text else DEFAULT_MAX
        return cls(default_root(), identity=identity, max_bytes=max_bytes)

    def _path(self, diff_id: str) -> Path:
        name = hashlib.sha256(f"{self.identity}\n{diff_id}".encode()).hexdigest()
        return self.root / name[:2] / f"{name}.scan"

    def has(self, diff_id: str) -> bool:
        """Whether an entry is there (cheap: not read, not checked; `get` may still miss)."""
        return _DIGEST.fullmatch(diff_id) is not None and self.max_bytes > 0 and self._path(diff_id).is_file()

    def get(self, diff_id: str) -> LayerScan | None:
        if not _DIGEST.fullmatch(diff_id) or self.max_bytes <= 0:
            return None
        path = self._path(diff_id)
        scan = self._held.get(diff_id)
        if scan is not None:
            try:
                os.utime(path)  # recently used: evicted last
            except OSError:     # evicted (or removed) since: as if never read
                del self._held[diff_id]
                return None
        else:
            try:
                raw = path.read_bytes()
            except OSError:
                return None
            scan = _decode(raw, self.identity, diff_id, path.name)
            if scan is None:
                return None
            with contextlib.suppress(OSError):
                os.utime(path)  # recently used: evicted last
            self._held[diff_id] = scan
        self.hits += 1
        return scan

    def put(self, diff_id: str, scan: LayerScan) -> None:
        """Store a scan of a layer whose uncompressed bytes had sha256 `diff_id` (checked by the
        caller). A cache that cannot be written (read-only, full) is skipped: it only saves time."""
        if not _DIGEST.fullmatch(diff_id) or self.max_bytes <= 0:
            return
        path = self._path(diff_id)
        body = _encode(scan, self.identity, diff_id, path.name)
        if body is None or len(body) > self.max_bytes:
            return
        try:
            cachedir.write_atomic(path, body, suffix=".scan")
        except OSError:
            return
        self.stores += 1
        # Counted once a run, then kept up to date: a fleet's thousand puts do not list the
        # folder a thousand times. Another run's writes are seen at the next count.
        if self._total is None:
            self._total = self._evict()
        else:
            self._total += len(body)
            if self._total > self.max_bytes:
                self._total = self._evict()

    def _evict(self) -> int:
        """Remove the least recently used entries while over the bound; the bytes left."""
        entries = []
        total = 0
        try:
            for folder in self.root.iterdir():
                if not folder.is_dir():
                    continue
                for item in folder.iterdir():
                    if not item.name.endswith(".scan"):
                        continue
                    try:
                        stat = item.stat()
                    except OSError:
                        continue
                    total += stat.st_size
                    entries.append((stat.st_mtime, stat.st_size, item))
        except OSError:
            return total
        if total <= self.max_bytes:
            return total
        for _, size, item in sorted(entries, key=lambda e: e[0]):
            if total <= self.max_bytes * 0.9:
                break
            with contextlib.suppress(OSError):
                item.unlink()
                total -= size
        return total


# --- the entry format: MAGIC, the seal of the rest, zlib of JSON ---------------------------------

def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: Any) -> bytes | None:
    return None if text is None else base64.b64decode(text, validate=True)


def _encode(scan: LayerScan, identity: str, diff_id: str, name: str) -> bytes | None:
    entries = {}
    for path, e in scan.entries.items():
        entries[path] = [e.kind, e.sha256, _b64(e.data), e.target, e.size, _b64(e.header),
                         None if e.source is None else [e.source[0], e.source[1], _b64(e.source[2])], e.too_large]
    folders = array.array("Q", sorted(k for k, v in scan.present.items() if v))
    others = array.array("Q", sorted(k for k, v in scan.present.items() if not v))
    document = {"identity": identity, "diff_id": diff_id, "where": scan.where, "entries": entries,
                "whiteouts": sorted(scan.whiteouts), "opaques": sorted(scan.opaques),
                "folders": _b64(folders.tobytes()), "others": _b64(others.tobytes()),
                "owners": _owner_columns(scan.owners)}
    payload = zlib.compress(json.dumps(document, separators=(",", ":"), ensure_ascii=False,
                                       ).encode("utf-8", "surrogateescape"), 6)
    sealed = seal.wrap("scans", name, payload)
    return None if sealed is None else MAGIC + sealed


def _owner_columns(owners: Mapping[int, tuple[int, int, int]]) -> list[str | None]:
    """path keys, modes, uids, gids: four packed arrays (a layer's folders are thousands)."""
    rows = sorted((k, *v) for k, v in owners.items())
    columns = list(zip(*rows, strict=True)) or [(), (), (), ()]
    return [_b64(array.array(code, column).tobytes()) for code, column in zip("QHII", columns, strict=True)]


def _decode(raw: bytes, identity: str, diff_id: str, name: str) -> LayerScan | None:
    """The scan an entry holds, or None for anything but an intact entry of this key sealed here."""
    if not raw.startswith(MAGIC):
        return None
    payload = seal.unwrap("scans", name, raw[len(MAGIC):])
    if payload is None:
        return None
    try:
        document = json.loads(zlib.decompress(payload).decode("utf-8", "surrogateescape"))
        if document["identity"] != identity or document["diff_id"] != diff_id:
            return None
        entries: dict[str, Entry] = {}
        for path, (kind, sha, data, target, size, header, source, too_large) in document["entries"].items():
            entries[path] = Entry(kind, sha256=sha, data=_unb64(data), target=target, size=int(size),
                                  header=_unb64(header),
                                  source=None if source is None else (int(source[0]), int(source[1]), _unb64(source[2])),
                                  too_large=bool(too_large))
        present: dict[int, bool] = dict.fromkeys(array.array("Q", _unb64(document["others"]) or b""), False)
        present.update(dict.fromkeys(array.array("Q", _unb64(document["folders"]) or b""), True))
        keys, modes, uids, gids = (array.array(code, _unb64(column) or b"")
                                   for code, column in zip("QHII", document["owners"], strict=True))
        owners = {k: (m, u, g) for k, m, u, g in zip(keys, modes, uids, gids, strict=True)}
        return LayerScan(where=str(document["where"]), entries=entries, whiteouts=frozenset(document["whiteouts"]),
                         opaques=frozenset(document["opaques"]), present=present, owners=owners)
    except (ValueError, KeyError, TypeError, zlib.error, UnicodeError):
        return None


def scan_identity(*parts: str, sources: Mapping[str, bytes] | None = None,
                  magic: bytes = importlib.util.MAGIC_NUMBER) -> str:
    """A predicate's identity: its parameters, the source of the code that scans (so a new
    reader never reuses an old reader's scans) and this host's bytecode magic number: a scan keeps
    each source's `importlib.util.source_hash`, which is keyed by the magic number of the python
    that computed it (targets/views/facts.py), so a 3.12 host and a 3.11 host sharing one cache
    folder must never answer each other (else an honest image reads as "tampered")."""
    digest = hashlib.sha256()
    digest.update(b"magic=" + magic + b"\0")
    for part in parts:
        digest.update(part.encode("utf-8", "surrogateescape") + b"\0")
    for name, data in sorted((sources or {}).items()):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    return digest.hexdigest()
