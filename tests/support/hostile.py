"""Hand-written layers and `docker save` archives, for tests that feed images to the tool (and to
the engine) which no Dockerfile could build: tar headers that two readers read differently,
symlinks over folders, whiteouts in odd places.

Generic on purpose (other tests reuse it): `layer([...])` writes a layer tar from a list of
members (`File`, `Dir`, `Link`, `Whiteout`, `Opaque`, `Raw` for bytes written as they are);
`raw_header(...)` writes one 512-byte header with any field forced; `save_archive(config,
layers)` writes a `docker save` archive (manifest.json, config, one `HEX/layer.tar` per layer)
whose lower layers may be layers the engine already holds (given by diff id, written empty: the
engine reuses them by digest, as dspark_patch/targets/docker/append.py relies on).
"""

from __future__ import annotations

import hashlib
import io
import json
import struct
import subprocess
import tarfile
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class File:
    path: str
    data: bytes = b""
    mode: int = 0o644


@dataclass(frozen=True)
class Dir:
    path: str


@dataclass(frozen=True)
class Link:
    path: str
    target: str


@dataclass(frozen=True)
class Whiteout:
    path: str        # the path the whiteout removes


@dataclass(frozen=True)
class Opaque:
    folder: str


@dataclass(frozen=True)
class Raw:
    data: bytes      # header block(s) and data, already padded


Member = File | Dir | Link | Whiteout | Opaque | Raw


def _pad(data: bytes) -> bytes:
    return data + bytes(-len(data) % 512)


def _tarinfo_bytes(info: tarfile.TarInfo, data: bytes = b"", fmt: int = tarfile.PAX_FORMAT) -> bytes:
    return info.tobuf(format=fmt, encoding="utf-8", errors="surrogateescape") + _pad(data)


def member_bytes(member: Member) -> bytes:
    if isinstance(member, Raw):
        return member.data
    if isinstance(member, File):
        info = tarfile.TarInfo(member.path)
        info.size, info.mode = len(member.data), member.mode
        return _tarinfo_bytes(info, member.data)
    if isinstance(member, Dir):
        info = tarfile.TarInfo(member.path)
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        return _tarinfo_bytes(info)
    if isinstance(member, Link):
        info = tarfile.TarInfo(member.path)
        info.type, info.linkname = tarfile.SYMTYPE, member.target
        return _tarinfo_bytes(info)
    if isinstance(member, Whiteout):
        folder, _, name = member.path.rpartition("/")
        return _tarinfo_bytes(tarfile.TarInfo(f"{folder}/.wh.{name}" if folder else f".wh.{name}"))
    return _tarinfo_bytes(tarfile.TarInfo(f"{member.folder}/.wh..wh..opq"))


def layer(members: Sequence[Member], *, end: bool = True) -> bytes:
    """A layer tar: the members in order, then the two end blocks."""
    return b"".join(member_bytes(m) for m in members) + (bytes(1024) if end else b"")


def _octal(value: int, width: int) -> bytes:
    return b"%0*o\0" % (width - 1, value)


def raw_header(name: bytes, *, size: int = 0, typeflag: bytes = b"0", linkname: bytes = b"",
               magic: bytes = b"ustar\x0000", prefix: bytes = b"", fields: Mapping[str, bytes] | None = None,
               tail: bytes = b"") -> bytes:
    """One header block. `fields` forces a numeric field's raw bytes ("size", "mode", "devmajor",
    "devminor", "uid", "gid", "mtime"); `tail` fills bytes 500-511; the checksum is computed last."""
    block = bytearray(512)
    spans = {"mode": (100, 8), "uid": (108, 8), "gid": (116, 8), "size": (124, 12), "mtime": (136, 12),
             "devmajor": (329, 8), "devminor": (337, 8)}
    values = {"mode": 0o644, "uid": 0, "gid": 0, "size": size, "mtime": 0, "devmajor": 0, "devminor": 0}
    block[0:len(name)] = name
    for key, (at, width) in spans.items():
        raw = (fields or {}).get(key, _octal(values[key], width))
        block[at:at + width] = raw.ljust(width, b"\0")[:width]
    block[156:157] = typeflag
    block[157:157 + len(linkname)] = linkname
    block[257:257 + len(magic)] = magic
    block[345:345 + len(prefix)] = prefix
    block[500:500 + len(tail)] = tail
    block[148:156] = b" " * 8
    block[148:156] = b"%06o\0 " % sum(block)
    return bytes(block)


def gzip_of_repeats(prefix: bytes, chunk: bytes, count: int) -> bytes:
    """A gzip stream of `prefix` and then `chunk` `count` times (a decompression bomb when the
    chunk is zeros), made without compressing every copy: the chunk is compressed once after a
    full flush (byte-aligned, no reference back into what came before), and that piece of the
    deflate stream is repeated. The trailer's CRC-32 and length are those of the whole."""
    raw = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = [raw.compress(prefix), raw.flush(zlib.Z_FULL_FLUSH)]
    piece = raw.compress(chunk) + raw.flush(zlib.Z_FULL_FLUSH)
    body += [piece] * count
    body.append(raw.flush())  # the final (empty) block
    crc = zlib.crc32(prefix)
    for _ in range(count):
        crc = zlib.crc32(chunk, crc)
    size = (len(prefix) + len(chunk) * count) & 0xFFFFFFFF
    header = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x02\xff"  # deflate, no name, no time, best, Unix
    return header + b"".join(body) + struct.pack("<II", crc, size)


def pax(records: Mapping[str, str], *, global_: bool = False) -> bytes:
    """A PAX extension header with its records, as one Raw member's bytes."""
    body = b""
    for key, value in records.items():
        text = f" {key}={value}\n".encode()
        length = len(text) + len(str(len(text)))
        length = len(text) + len(str(length))
        body += str(length).encode() + text
    return raw_header(b"././@PaxHeader", size=len(body), typeflag=b"g" if global_ else b"x") + _pad(body)


def gnu_long(name: str, *, link: bool = False) -> bytes:
    data = name.encode() + b"\0"
    return raw_header(b"././@LongLink", size=len(data), typeflag=b"K" if link else b"L",
                      magic=b"ustar  \0") + _pad(data)


def diff_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def image_config(diff_ids: Sequence[str], *, config: Mapping[str, Any] | None = None) -> dict[str, Any]:
    return {"architecture": "amd64", "os": "linux", "created": "2026-01-01T00:00:00Z",
            "config": dict(config or {}), "rootfs": {"type": "layers", "diff_ids": list(diff_ids)}}


def save_archive(layers: Sequence[bytes | str], *, config: Mapping[str, Any] | None = None,
                 tag: str | None = None) -> tuple[bytes, str]:
    """A `docker save` archive of one image; returns (archive bytes, image id).

    `layers`: bottom first; bytes are a layer's tar, a str is the diff id of a layer the engine
    already holds (written as an empty file the engine does not read)."""
    ids = [item if isinstance(item, str) else diff_id(item) for item in layers]
    doc = image_config(ids, config=config)
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    config_hex = hashlib.sha256(blob).hexdigest()
    names = [f"{i.split(':', 1)[1]}/layer.tar" for i in ids]
    manifest = [{"Config": f"{config_hex}.json", "RepoTags": [tag] if tag else None, "Layers": names}]
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:") as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        add(f"{config_hex}.json", blob)
        written = set()
        for name, item in zip(names, layers, strict=True):
            if name not in written:
                add(name, item if isinstance(item, bytes) else b"")
                written.add(name)
        add("manifest.json", json.dumps(manifest).encode())
    return out.getvalue(), f"sha256:{config_hex}"


def docker_load(archive: bytes) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(["docker", "load"], input=archive, capture_output=True, check=False, timeout=600)
