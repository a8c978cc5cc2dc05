"""The key that seals this machine's cache entries, kept outside the cache folder.

The cache folder (`$DSPARK_PATCH_CACHE`: layer scans, kept answers, bytecode proofs) saves
work; it must never decide a verdict. CI systems restore it from a cache that other jobs (a
pull request from a fork, say) can write, so an entry is believed only when it carries the
HMAC-SHA256, under this key, of what it says and of the name it is kept under. An entry
written anywhere else, copied to another name, rewritten (its checksum recomputed), or planted
is then a miss: the work is done again and the run's report notes it.

- **Where.** `$DSPARK_PATCH_CACHE_KEY` (a file path), else `$XDG_STATE_HOME/dspark-patch/cache.key`
  (default `~/.local/state/dspark-patch/cache.key`): never inside the cache folder, so restoring
  the cache does not restore the key. A key path inside the cache folder is refused.
- **Made on first use**: 32 random bytes, mode 0600, linked into place whole (two runs at once
  agree on one key).
- **Refused** (the caches are then off for the run, a note says why): a key that is not a
  regular file owned by this user, one that group or others may read or write, one of another
  size, one behind a link.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import stat
import threading
from pathlib import Path

from . import cachedir

ENV_KEY = "DSPARK_PATCH_CACHE_KEY"
KEY_BYTES = 32
MAC_BYTES = 32

_lock = threading.Lock()
_state: dict[str, bytes | None] = {}   # "key" -> this process's key (None: caches off), once loaded
_notes: list[str] = []                  # what this process refused, in order, once each


def key_path() -> Path:
    given = os.environ.get(ENV_KEY, "").strip()
    if given:
        return Path(given)
    state = os.environ.get("XDG_STATE_HOME", "").strip()
    base = Path(state) if state else Path(os.path.expanduser("~")) / ".local" / "state"
    return base / "dspark-patch" / "cache.key"


def notes() -> tuple[str, ...]:
    """What the caches refused in this process (a key they could not use, entries whose seal
    did not hold), one line each: the reports carry them."""
    with _lock:
        return tuple(_notes)


def _note(line: str) -> None:
    with _lock:
        if line not in _notes:
            _notes.append(line)


def refused(kind: str, name: str) -> None:
    """Say that an entry of `kind` (scans, answers, bytecode) was there and its seal did not hold."""
    _note(f"a {kind} entry in the cache folder ({name[:16]}) is not sealed by this machine's cache key: "
          "not used, the work was done again")


def _inside(path: Path, folder: Path) -> bool:
    a, b = os.path.realpath(path), os.path.realpath(folder)
    return a == b or a.startswith(b.rstrip("/") + "/")


def _create(path: Path) -> None:
    """A new key at `path`, whole or not at all (a temporary file linked into place)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temp = path.parent / f".{path.name}.{secrets.token_hex(8)}"
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(secrets.token_bytes(KEY_BYTES))
            fh.flush()
            os.fsync(fh.fileno())
        with contextlib.suppress(FileExistsError):   # another run made one first: use that one
            os.link(temp, path)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temp)


def _load() -> bytes | None:
    path = key_path()
    if _inside(path, cachedir.home()):
        _note(f"the cache key {path} lies inside the cache folder, which others may write: caches not used "
              f"(set {ENV_KEY} to a file outside it)")
        return None
    for _ in range(2):
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            try:
                _create(path)
            except OSError as exc:
                _note(f"no cache key could be made at {path} ({exc.strerror or exc}): caches not used")
                return None
            continue
        except OSError as exc:
            _note(f"the cache key {path} cannot be read ({exc.strerror or exc}, a link?): caches not used")
            return None
        try:
            st = os.fstat(fd)
            why = ("not a regular file" if not stat.S_ISREG(st.st_mode)
                   else "owned by another user" if st.st_uid != os.geteuid()
                   else "readable or writable by group or others (chmod 600 it)" if st.st_mode & 0o077
                   else f"not {KEY_BYTES} bytes" if st.st_size != KEY_BYTES else "")
            if why:
                _note(f"the cache key {path} is {why}: caches not used")
                return None
            return os.read(fd, KEY_BYTES)
        finally:
            os.close(fd)
    return None


def key() -> bytes | None:
    """This machine's cache key, made on first use; None when it cannot be used (caches off)."""
    with _lock:
        if "key" in _state:
            return _state["key"]
    loaded = _load()
    with _lock:
        return _state.setdefault("key", loaded)


def mac(kind: str, name: str, body: bytes) -> bytes | None:
    """The seal of `body` kept as entry `name` of `kind`; None when there is no key."""
    secret = key()
    if secret is None:
        return None
    return hmac.new(secret, b"%s\0%s\0" % (kind.encode(), name.encode("utf-8", "surrogateescape")) + body,
                    hashlib.sha256).digest()


def wrap(kind: str, name: str, body: bytes) -> bytes | None:
    """`body` with its seal in front, as it is written; None when there is no key (keep nothing)."""
    seal = mac(kind, name, body)
    return None if seal is None else seal + body


def unwrap(kind: str, name: str, raw: bytes) -> bytes | None:
    """The body of a sealed entry, or None (no key, or a seal that does not hold: noted)."""
    seal = mac(kind, name, raw[MAC_BYTES:])
    if seal is None:
        return None
    if len(raw) < MAC_BYTES or not hmac.compare_digest(seal, raw[:MAC_BYTES]):
        refused(kind, name)
        return None
    return raw[MAC_BYTES:]

