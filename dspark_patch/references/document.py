"""A reference file read back, checked as strictly as the builder writes it (build.py).

A user's reference (references/user.py) is a file anyone who can write its folder could edit,
and it decides what `status`, `verify`, `apply` and `publish` accept as the published wheel. So
every reference, shipped or not, is read one way and refused whole on any doubt: at most
`MAX_COMPRESSED` bytes of gzip that open to at most `MAX_JSON` bytes of UTF-8 JSON with no key
twice (two readers could take different values), exactly the builder's keys, each of its type;
every path relative and plain (no `..`, `.`, empty or absolute part, no backslash or NUL), every
sha256 64 lower-case hex digits, every size a non-negative integer; the wheel's dist-info
(`<dist>-<release>.dist-info`, holding WHEEL) among its files; and its distribution, release
and tags the ones its own file name and wheel name spell. A reference is never half used.
"""

from __future__ import annotations

import gzip
import io
import json
import re
import zlib
from collections.abc import Mapping
from dataclasses import dataclass

MAX_COMPRESSED = 16 * 1024 * 1024   # the shipped ones are about 0.3 MiB
MAX_JSON = 64 * 1024 * 1024         # and about 1 MiB of JSON
KEYS = frozenset({"distribution", "release", "tag", "wheel", "wheel_tags", "scripts", "files"})
SUFFIX = ".json.gz"
_NAME = re.compile(r"^[A-Za-z0-9_.]+$")                 # a wheel file name's distribution (no '-')
_RELEASE = re.compile(r"^[A-Za-z0-9_.!+]+$")            # a wheel file name's version (no '-')
_TAG = re.compile(r"^(?:[0-9][A-Za-z0-9_.]*-)?[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+$")  # [build-]py-abi-platform
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_PATH = re.compile(r"[^/\\\x00]+(?:/[^/\\\x00]+)*\Z")    # relative, no empty part, no backslash or NUL
_SCRIPT = re.compile(r"^[A-Za-z0-9_.+-]+$")


class Invalid(ValueError):
    """Why a reference file is not one the tool can trust (one line)."""


@dataclass(frozen=True, kw_only=True)
class Document:
    distribution: str
    release: str
    wheel: str
    files: Mapping[str, tuple[str, int]]
    scripts: Mapping[str, str]


def split_name(name: str) -> tuple[str, str, str] | None:
    """`<dist>-<release>-<tag>.json.gz` -> (dist, release, tag), or None for another name."""
    if not name.endswith(SUFFIX) or name.startswith("."):
        return None
    parts = name.removesuffix(SUFFIX).split("-", 2)
    if len(parts) != 3 or not _NAME.match(parts[0]) or not _RELEASE.match(parts[1]) or not _TAG.match(parts[2]):
        return None
    return parts[0], parts[1], parts[2]


def decode(data: bytes, name: str) -> Document:
    """The reference in `data`, read from a file called `name`; Invalid on any doubt."""
    if len(data) > MAX_COMPRESSED:
        raise Invalid(f"{len(data)} bytes, more than the {MAX_COMPRESSED} a reference may have")
    spelled = split_name(name)
    if spelled is None:
        raise Invalid("its file name is not <distribution>-<release>-<wheel tags>.json.gz")
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as fh:
            text = fh.read(MAX_JSON + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise Invalid(f"not gzip ({exc})") from None
    if len(text) > MAX_JSON:
        raise Invalid(f"it opens to more than the {MAX_JSON} bytes a reference may have")
    try:
        doc = json.loads(text.decode("utf-8"), object_pairs_hook=_no_twice, parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as exc:
        raise Invalid(f"not JSON ({str(exc)[:120]})") from None
    if not isinstance(doc, dict) or set(doc) != KEYS:
        keys = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
        raise Invalid(f"not the builder's document (keys {keys}; expected {sorted(KEYS)})")
    for key in ("distribution", "release", "tag", "wheel"):
        if not isinstance(doc[key], str):
            raise Invalid(f"{key} is not a string")
    dist, release, tag = spelled
    if (doc["distribution"], doc["release"], doc["tag"]) != (dist, release, tag):
        raise Invalid(f"it says {doc['distribution']} {doc['release']} {doc['tag']}, its file name {dist} {release} {tag}")
    if doc["wheel"] != f"{dist}-{release}-{tag}.whl":
        raise Invalid(f"its wheel {doc['wheel']!r} is not {dist}-{release}-{tag}.whl")
    if not isinstance(doc["wheel_tags"], list) or not all(isinstance(t, str) for t in doc["wheel_tags"]):
        raise Invalid("wheel_tags is not a list of strings")
    scripts = doc["scripts"]
    if not isinstance(scripts, dict) or not all(
            isinstance(k, str) and _SCRIPT.match(k) and isinstance(v, str) and ":" in v for k, v in scripts.items()):
        raise Invalid("scripts is not an object of console-script name -> \"module:attr\"")
    files = _files(doc["files"])
    info = f"{dist}-{release}.dist-info"
    if f"{info}/WHEEL" not in files or any(
            f.endswith(".dist-info") and f != info for f in {p.split("/", 1)[0] for p in files if "/" in p}):
        raise Invalid(f"its files are not one wheel's: {info}/WHEEL must be there and no other dist-info")
    return Document(distribution=dist, release=release, wheel=doc["wheel"], files=files, scripts=dict(scripts))


def _files(value: object) -> dict[str, tuple[str, int]]:
    if not isinstance(value, dict) or not value:
        raise Invalid("files is not a non-empty object of path -> [sha256, size]")
    files: dict[str, tuple[str, int]] = {}
    for path, entry in value.items():
        if not _PATH.match(path) or "/./" in f"/{path}/" or "/../" in f"/{path}/":
            raise Invalid(f"files: {path[:120]!r} is not a plain relative path")
        if not (type(entry) is list and len(entry) == 2 and type(entry[0]) is str and _SHA256.match(entry[0])
                and type(entry[1]) is int and entry[1] >= 0):
            raise Invalid(f"files: {path[:120]!r} is not [64 lower-case hex digits, a size]")
        files[path] = (entry[0], entry[1])
    return files


def _no_twice(pairs: list[tuple[str, object]]) -> dict[str, object]:
    found: dict[str, object] = {}
    for key, value in pairs:
        if key in found:
            raise ValueError(f"key {key[:80]!r} twice")
        found[key] = value
    return found


def _no_constant(word: str) -> object:
    raise ValueError(f"{word} is not JSON")
