"""Find an installed distribution without importing it. Standard library only.

This file runs in two places: imported by the local-tree target, and shipped as source to a
container's own interpreter (`python3 -B -c SOURCE NAME`) by the image target, which reads the
one JSON line it prints. Importing the distribution would run its code (vLLM's import pulls in
torch, CUDA probing, plugins), so only `importlib.util.find_spec` on the top-level name and
`importlib.metadata` are used: neither executes the package.
"""

from __future__ import annotations

import base64
import binascii
import csv
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import re
import sys

RECORD_CAP = 32 << 20   # bytes; vLLM's RECORD is under 1 MiB
_B64 = re.compile(r"^[A-Za-z0-9_-]+$")
_DIGEST_SIZES = {"sha256": 32, "sha384": 48, "sha512": 64}


class BadRecord(ValueError):
    """A RECORD that is not the wheel spec's CSV (path, algo=urlsafe-b64 digest, size)."""


def _hash_field(field):
    """"sha256=<b64>" -> hex digest; "" -> None; another known algorithm -> None; else BadRecord."""
    if field == "":
        return None
    algo, sep, value = field.partition("=")
    size = _DIGEST_SIZES.get(algo)
    if not sep or size is None or not _B64.match(value) or len(value) != (size * 4 + 2) // 3:
        raise BadRecord(f"hash {field[:80]!r} is not sha256=<urlsafe base64>")
    try:
        digest = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        raise BadRecord(f"hash {field[:80]!r} is not urlsafe base64") from None
    if len(digest) != size:
        raise BadRecord(f"hash {field[:80]!r} has the wrong length")
    return digest.hex() if algo == "sha256" else None


def parse_record(text, *, strict=True):
    """RECORD's rows as (path, sha256 hex or None, size or None).

    strict: a malformed row raises BadRecord naming it; otherwise it is skipped."""
    rows = []
    try:
        reader = csv.reader(io.StringIO(text))
        for number, row in enumerate(reader, 1):
            if not row:
                continue
            try:
                if len(row) != 3 or not row[0]:
                    raise BadRecord(f"{len(row)} fields, expected path,hash,size")
                size = row[2]
                if size and not (size.isascii() and size.isdigit() and len(size) <= 15):
                    raise BadRecord(f"size {size[:40]!r} is not a number")
                rows.append((row[0], _hash_field(row[1]), int(size) if size else None))
            except BadRecord as exc:
                if strict:
                    raise BadRecord(f"row {number} ({row[0][:120]!r}): {exc}") from None
    except csv.Error as exc:
        if strict:
            raise BadRecord(f"not CSV: {exc}") from None
    return rows


def read_record_rows(path, *, strict=True):
    """A RECORD file's rows (parse_record), read only if it is a regular file under RECORD_CAP."""
    import stat

    st = os.lstat(path)
    if not stat.S_ISREG(st.st_mode):
        raise BadRecord("RECORD is not a regular file")
    if st.st_size > RECORD_CAP:
        raise BadRecord(f"RECORD is {st.st_size} bytes, over the {RECORD_CAP >> 20} MiB limit")
    with open(path, "rb") as fh:
        data = fh.read(RECORD_CAP + 1)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BadRecord("RECORD is not UTF-8") from None
    return parse_record(text, strict=strict)


def record_of(dist: importlib.metadata.Distribution) -> tuple[str | None, list]:
    """RECORD's path relative to the location (or None) and its rows as [path, sha256, size].

    Raises BadRecord for a malformed, oversized or non-regular RECORD."""
    info = getattr(dist, "_path", None)  # PathDistribution: the .dist-info folder
    if info is None or not os.path.lexists(os.path.join(str(info), "RECORD")):
        return None, []
    rows = read_record_rows(os.path.join(str(info), "RECORD"))
    return f"{os.path.basename(str(info))}/RECORD", [list(row) for row in rows]


def locate(name: str) -> dict:
    """Describe distribution `name` as this interpreter sees it.

    Returns a JSON-ready dict: always `found`, `python`, `python_version`, `sys_path`; when
    found also `name`, `version`, `location`, `package_dir`, `record_file` (RECORD's path
    relative to `location`, or None) and `record` ([path, sha256, size]); `record_error` when
    RECORD is malformed; `duplicates` when more than one dist-info of the name is on sys.path.
    """
    result: dict = {
        "found": False,
        "python": sys.executable,
        "python_version": platform.python_version(),
        "cache_tag": sys.implementation.cache_tag,
        "sys_path": [p for p in sys.path if p],
    }
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return result
    # The folder holding the .dist-info, i.e. the site-packages the package is installed in.
    location = os.path.normpath(str(dist.locate_file("")))
    top = name.replace("-", "_").lower()
    # find_spec on a top-level name locates it without executing it.
    spec = importlib.util.find_spec(top)
    package_dir = None
    if spec is not None and spec.submodule_search_locations:
        package_dir = os.path.normpath(list(spec.submodule_search_locations)[0])
    try:
        record_file, record = record_of(dist)
    except (BadRecord, OSError) as exc:
        result.update(found=True, name=dist.metadata["Name"], version=dist.version, location=location,
                      package_dir=package_dir, record_error=str(exc), record_file=None, record=[])
        return result
    duplicates = sorted({os.path.normpath(str(d.locate_file(""))) + "/" + os.path.basename(str(getattr(d, "_path", "")))
                         for d in importlib.metadata.distributions(name=name)})
    if len(duplicates) > 1:
        result["duplicates"] = duplicates
    result.update(
        found=True,
        name=dist.metadata["Name"],
        version=dist.version,
        location=location,
        package_dir=package_dir,
        record_file=record_file,
        record=record,
    )
    return result


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        sys.stderr.write("usage: locate.py DISTRIBUTION\n")
        return 2
    sys.stdout.write(json.dumps(locate(argv[0])) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
