"""A strict, streaming tar reader: the headers Go's `archive/tar` (the engine) and Python's
`tarfile` read alike, and nothing else.

Why our own parser instead of `tarfile`: a layer is hostile input, and the two readers differ on
bytes an attacker chooses (docs/status.md: tar differentials). `tarfile` stops silently on a bad header, cuts a
numeric field at its first NUL (Go trims NULs and spaces at both ends, so a size of
`"\\0" + "0000001000"` is 0 for one and 512 for the other: the second reader sees a hidden header),
joins a V7 header's prefix field that Go ignores, lets a global PAX header or a PAX path plus a GNU
long name resolve differently. Here every header is checked whole and any ambiguity is refused with
`HostileLayer` naming the layer and the member; it is never skipped, and reading never stops early.

The rules (docs/status.md, "The layer reader"):
- a block is a header only with a correct checksum; the end is two zero blocks (one zero block then
  data is refused, a stream that ends before them is refused);
- magic `ustar\\0` + `00` (POSIX), `ustar ` + ` \\0` (GNU) or none at all (V7: bytes 257-511 zero);
  the prefix field only in POSIX headers, never with the star trailer; GNU headers without
  atime/ctime/sparse fields;
- numeric fields: spaces, octal digits, then only NULs or spaces (or base-256, which both read
  alike); anything else is refused;
- type flags: regular (`0`, `\\0`), hard link, symlink, char, block, folder, FIFO; extensions `x`
  (PAX, one per member, not with `L`/`K`), `L`, `K` (one each); global PAX (`g`), sparse (`S`,
  `GNU.sparse.*`), `hdrcharset`, contiguous (`7`) and unknown flags are refused;
- names: relative, no empty, `.` or `..` component (one leading `./` allowed), no NUL (a
  backslash is an ordinary character, as on every Linux engine); a trailing `/` only on folders;
- overlayfs xattrs (`trusted.overlay.*`, `user.overlay.*` as SCHILY or LIBARCHIVE records) are
  refused: overlay2 applies them (an opaque folder hides every lower file), which no reader models;
- caps: members, PAX record size, name length (`Limits`).
Memory is one header and one chunk at a time; data is streamed to the caller or skipped.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Literal

from ...errors import HostileLayer

BLOCK = 512
Kind = Literal["file", "dir", "symlink", "hardlink", "other"]
_KINDS: dict[bytes, Kind] = {b"0": "file", b"\0": "file", b"1": "hardlink", b"2": "symlink", b"3": "other",
                             b"4": "other", b"5": "dir", b"6": "other"}
_OCTAL = re.compile(rb"^ *[0-7]*[ \0]*$")
_DIGITS = re.compile(r"^[0-9]+$")
_PAX_TIME = re.compile(r"^-?[0-9]+(\.[0-9]+)?$")
_PAX_KEYS_REFUSED = ("GNU.sparse.", "hdrcharset")
_OVERLAY_XATTRS = ("SCHILY.xattr.trusted.overlay.", "LIBARCHIVE.xattr.trusted.overlay.",
                   "SCHILY.xattr.user.overlay.", "LIBARCHIVE.xattr.user.overlay.")


@dataclass(frozen=True, kw_only=True)
class Limits:
    members: int = 2_000_000
    pax_bytes: int = 1 << 20
    name_bytes: int = 4096
    depth: int = 256


@dataclass(frozen=True, kw_only=True)
class Member:
    name: str          # clean, relative, no trailing slash ("" for the root folder itself)
    kind: Kind
    size: int
    linkname: str      # symlink target as written; hard link target (clean) for hard links
    mode: int
    index: int         # position in the archive
    mtime: int = 0     # seconds (a PAX mtime's fraction dropped, as a .pyc header keeps it)
    uid: int = 0       # the owner the engine gives it (a PAX uid/gid over the header's)
    gid: int = 0
    pax: tuple[str, ...] = ()   # the keys of its PAX records (xattrs, ACLs, names... as written)

    @property
    def owner(self) -> tuple[int, int, int]:
        """(permission bits, uid, gid): what a layer rewriting this path must keep."""
        return self.mode & 0o7777, self.uid, self.gid


class TarStream:
    """Iterate the members of one tar stream; `chunks()` streams the current member's data.

    `where` names the archive in errors ("layer sha256:…")."""

    def __init__(self, fileobj: BinaryIO, *, where: str, limits: Limits = Limits()) -> None:
        self._fh = fileobj
        self.where = where
        self.limits = limits
        self._left = 0        # data bytes of the current member not yet read
        self._pad = 0
        self._current: str = ""

    # --- errors ---------------------------------------------------------------------------------
    def refuse(self, problem: str, name: str | None = None) -> HostileLayer:
        member = name if name is not None else self._current
        at = f", member {member!r}" if member else ""
        return HostileLayer(f"{self.where}{at}: {problem}",
                            hint="the engine and a tar reader could unpack it differently; nothing is said about "
                                 "this image: rebuild it with a standard tool")

    # --- reading --------------------------------------------------------------------------------
    def _read_exact(self, n: int) -> bytes:
        parts = []
        while n:
            chunk = self._fh.read(min(n, 1 << 20))
            if not chunk:
                raise self.refuse("the archive ends inside a member or before its end blocks")
            parts.append(chunk)
            n -= len(chunk)
        return b"".join(parts)

    def _skip_rest(self) -> None:
        for _ in self.chunks():
            pass
        if self._pad:
            self._read_exact(self._pad)
            self._pad = 0

    def chunks(self, size: int = 1 << 20) -> Iterator[bytes]:
        """The current member's data, in chunks (each byte once)."""
        while self._left:
            chunk = self._fh.read(min(self._left, size))
            if not chunk:
                raise self.refuse("the archive ends inside a member's data")
            self._left -= len(chunk)
            yield chunk

    def read_all(self, cap: int) -> bytes:
        if self._left > cap:
            raise self.refuse(f"a member of {self._left} bytes is kept whole here and the cap is {cap}")
        return b"".join(self.chunks())

    def __iter__(self) -> Iterator[Member]:
        index = 0
        pax: dict[str, str] | None = None
        long_name: str | None = None
        long_link: str | None = None
        while True:
            self._skip_rest()
            block = self._block()
            if block is None or block == bytes(BLOCK):
                # The end: two zero blocks, or (both readers agree) the stream's end at a header.
                second = self._block() if block is not None else None
                if second is not None and second != bytes(BLOCK):
                    raise self.refuse("one zero block followed by data (one reader stops there, another reads on)",
                                      name="")
                if pax is not None or long_name is not None or long_link is not None:
                    raise self.refuse("an extension header with no member after it", name="")
                return
            index += 1
            if index > self.limits.members:
                raise self.refuse(f"more than {self.limits.members} members", name="")
            flag, raw_name, raw_link, size, mode, mtime, (uid, gid) = self._header(block)
            self._current = raw_name
            self._left, self._pad = size, -size % BLOCK
            if flag in (b"x", b"L", b"K"):
                cap = self.limits.pax_bytes if flag == b"x" else self.limits.name_bytes + 1
                if size > cap:
                    raise self.refuse(f"an extension header of {size} bytes (cap {cap})")
                data = self._read_exact(size) if size else b""
                self._left = 0
                if flag == b"x":
                    if pax is not None:
                        raise self.refuse("two PAX headers for one member")
                    if long_name is not None or long_link is not None:
                        raise self.refuse("a PAX header combined with a GNU long name or link")
                    pax = self._pax(data)
                else:
                    if pax is not None:
                        raise self.refuse("a GNU long name or link combined with a PAX header")
                    text = self._gnu_long(data)
                    if flag == b"L":
                        if long_name is not None:
                            raise self.refuse("two GNU long names for one member")
                        long_name = text
                    else:
                        if long_link is not None:
                            raise self.refuse("two GNU long links for one member")
                        long_link = text
                continue
            kind = _KINDS.get(flag)
            if kind is None:
                label = {b"g": "a global PAX header", b"S": "a sparse file", b"7": "a contiguous file"}.get(
                    flag, f"type flag {flag!r}")
                raise self.refuse(f"{label} (refused: readers differ on it)")
            name, link = raw_name, raw_link
            keys: tuple[str, ...] = ()
            if pax is not None:
                keys = tuple(sorted(pax))
                uid, gid = int(pax.get("uid", uid)), int(pax.get("gid", gid))
                name = pax.get("path", name)
                link = pax.get("linkpath", link)
                if "mtime" in pax:
                    mtime = int(float(pax["mtime"]))
                if "size" in pax:
                    if not _DIGITS.match(pax["size"]):
                        raise self.refuse(f"PAX size {pax['size']!r} is not a number")
                    size = int(pax["size"])
                    self._left, self._pad = size, -size % BLOCK
            if not (0 <= uid < 1 << 32 and 0 <= gid < 1 << 32):
                raise self.refuse(f"owner {uid}:{gid}, which no Linux engine can give a file (uid_t is 32 bits)")
            if long_name is not None:
                name = long_name
            if long_link is not None:
                link = long_link
            pax = long_name = long_link = None
            self._current = name
            if flag == b"\0" and name.endswith("/") != raw_name.endswith("/"):
                raise self.refuse("a V7 folder name whose trailing '/' only one of its names has (readers type it differently)")
            if flag == b"\0" and name.endswith("/"):
                kind = "dir"  # the old V7 way of writing a folder; both readers agree
            if kind in ("dir", "symlink", "hardlink", "other") and size and kind != "dir":
                raise self.refuse(f"a {kind} entry with {size} bytes of data")
            clean = self._clean(name, kind)
            if kind == "hardlink":
                link = self._clean(link, "file")
                if not link:
                    raise self.refuse("a hard link to the root folder")
            elif kind == "symlink":
                if not link or "\0" in link:
                    raise self.refuse("a symlink with an empty target or a NUL in it")
            if len(link.encode("utf-8", "surrogateescape")) > self.limits.name_bytes:
                raise self.refuse(f"a link target longer than {self.limits.name_bytes} bytes")
            yield Member(name=clean, kind=kind, size=size if kind in ("file", "dir") else 0, linkname=link,
                         mode=mode, index=index, mtime=mtime, uid=uid, gid=gid, pax=keys)

    def _block(self) -> bytes | None:
        block = self._fh.read(BLOCK)
        if not block:
            return None
        if len(block) < BLOCK:
            block += self._read_exact(BLOCK - len(block))
        return block

    # --- headers --------------------------------------------------------------------------------
    def _header(self, block: bytes) -> tuple[bytes, str, str, int, int, int, tuple[int, int]]:
        self._current = _text(block[0:100].split(b"\0", 1)[0])
        stored = self._number(block[148:156], "checksum")
        unsigned = sum(block) - sum(block[148:156]) + 8 * 32
        # Both readers also take the sum of signed bytes (old writers); computed only when needed.
        if stored != unsigned and stored != unsigned - 256 * sum(
                1 for b in block[:148] + block[156:] if b > 127):
            raise self.refuse("a header checksum that does not match (not a tar header)")
        magic, version = block[257:263], block[263:265]
        flag = block[156:157]
        posix = magic == b"ustar\0" and version == b"00"
        gnu = magic == b"ustar " and version == b" \0"
        if posix:
            if any(block[500:512]):
                raise self.refuse("a POSIX header with bytes in its star trailer (readers take the prefix differently)")
        elif gnu:
            if any(block[345:512]):
                raise self.refuse("a GNU header with atime, ctime or sparse fields (one reader takes them for a name prefix)")
        elif any(block[257:512]):
            raise self.refuse("a header with no known magic but bytes after the link name (a V7 prefix one reader "
                              "joins and another ignores)")
        for field, at in (("mode", 100), ("uid", 108), ("gid", 116), ("mtime", 136)):
            self._number(block[at:at + 8 if field != "mtime" else at + 12], field)
        size = self._number(block[124:136], "size")
        if posix or gnu:
            self._number(block[329:337], "devmajor")
            self._number(block[337:345], "devminor")
        name_field = block[0:100]
        self._nul_terminated(name_field, "name")
        self._nul_terminated(block[157:257], "link name")
        name = name_field.split(b"\0", 1)[0]
        if posix:
            self._nul_terminated(block[345:500], "prefix")
            prefix = block[345:500].split(b"\0", 1)[0]
            if prefix:
                name = prefix + b"/" + name
        if size < 0:
            raise self.refuse("a negative size")
        mode = self._number(block[100:108], "mode")
        mtime = self._number(block[136:148], "mtime")
        owner = (self._number(block[108:116], "uid"), self._number(block[116:124], "gid"))
        return flag, _text(name), _text(block[157:257].split(b"\0", 1)[0]), size, mode, mtime, owner

    def _nul_terminated(self, field: bytes, what: str) -> None:
        head, sep, rest = field.partition(b"\0")
        if sep and any(rest):
            raise self.refuse(f"bytes after the NUL that ends the {what} field")

    def _number(self, field: bytes, what: str) -> int:
        if field[:1] in (b"\x80", b"\xff"):  # base-256: both readers take it the same way
            value = int.from_bytes(field[1:], "big")
            return value - (1 << (8 * (len(field) - 1))) if field[:1] == b"\xff" else value
        if not _OCTAL.match(field):
            raise self.refuse(f"the {what} field {field!r} is not plain octal (readers differ on it)")
        digits = field.strip(b" \0")
        return int(digits, 8) if digits else 0

    def _gnu_long(self, data: bytes) -> str:
        head, sep, rest = data.partition(b"\0")
        if any(rest):
            raise self.refuse("bytes after the NUL of a GNU long name")
        if b"\0" in head:
            raise self.refuse("a NUL inside a GNU long name")
        if len(head) > self.limits.name_bytes:
            raise self.refuse(f"a name longer than {self.limits.name_bytes} bytes")
        return _text(head)

    def _pax(self, data: bytes) -> dict[str, str]:
        records: dict[str, str] = {}
        at = 0
        while at < len(data):
            space = data.find(b" ", at)
            length_text = data[at:space] if space > 0 else b""
            if not length_text.isdigit() or length_text.startswith(b"0"):
                raise self.refuse("a malformed PAX record length")
            end = at + int(length_text)
            if end > len(data) or data[end - 1:end] != b"\n":
                raise self.refuse("a PAX record that does not end where its length says")
            key, eq, value = data[space + 1:end - 1].partition(b"=")
            if not eq or not key or b"\0" in key:
                raise self.refuse("a malformed PAX record")
            try:
                text_key = key.decode("utf-8")
                text_value = value.decode("utf-8")
            except UnicodeDecodeError:
                raise self.refuse(f"a PAX record {key!r} that is not UTF-8 (readers decode it differently)") from None
            if text_key.startswith(_OVERLAY_XATTRS):
                raise self.refuse(f"PAX record {text_key}: an overlayfs xattr, which the engine applies (an opaque or "
                                  "redirected folder) and no reader of the layer sees")
            if text_key.startswith(_PAX_KEYS_REFUSED):
                raise self.refuse(f"PAX record {text_key} (sparse files and charsets are refused)")
            if text_key in records:
                raise self.refuse(f"PAX record {text_key} twice in one header")
            if text_key in ("uid", "gid", "size") and not _DIGITS.match(text_value) or (
                    text_key in ("mtime", "atime", "ctime") and not _PAX_TIME.match(text_value)):
                raise self.refuse(f"PAX {text_key} {text_value!r} is not a number")
            if text_key in ("path", "linkpath") and ("\0" in text_value or not text_value):
                raise self.refuse(f"PAX {text_key} is empty or holds a NUL")
            records[text_key] = text_value   # every key: what a caller judges (new_layer.py) it sees
            at = end
        return records

    def _clean(self, name: str, kind: Kind) -> str:
        if len(name.encode("utf-8", "surrogateescape")) > self.limits.name_bytes:
            raise self.refuse(f"a name longer than {self.limits.name_bytes} bytes")
        if name.endswith("/") and kind != "dir":
            raise self.refuse(f"a {kind} whose name ends with '/'")
        path = name[2:] if name.startswith("./") else name
        path = path.removesuffix("/") if kind == "dir" else path
        if path in ("", "."):
            if kind != "dir":
                raise self.refuse(f"a {kind} at the root folder itself")
            return ""
        # A backslash is an ordinary character to every Linux engine (systemd's unit names hold
        # `\x2d`), so it is kept as one; only what engines clean or join differently is refused.
        if path.startswith("/") or "\0" in path:
            raise self.refuse("a name that is absolute or holds a NUL")
        parts = path.split("/")
        if any(p in ("", ".", "..") for p in parts):
            raise self.refuse("a name with an empty, '.' or '..' component (engines clean such names differently)")
        if len(parts) > self.limits.depth:
            raise self.refuse(f"a name deeper than {self.limits.depth} folders")
        return path


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")
