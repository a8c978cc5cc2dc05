"""Check an installed distribution against its RECORD, and patched files' bytecode.

Usage: python -B -c SOURCE REQUEST_JSON, where the request is
  {"location": DIR, "record": "vllm-0.33.0.dist-info/RECORD",
   "skip": [paths checked elsewhere (the patched files)], "bytecode": [patched source paths]}
Prints {"checked", "mismatched", "missing", "not_checked", "bytecode": {path: detail-or-""}}.
RECORD entries that point outside the location (a `--target` install records console scripts
as ../../bin/vllm) are listed as not checked and never followed.
"""

import base64
import csv
import hashlib
import importlib.util
import json
import os
import sys


def _digest(path):
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.digest()


def _inside(location, rel):
    full = os.path.realpath(os.path.join(location, rel))
    root = os.path.realpath(location)
    return full == root or full.startswith(root + os.sep)


def check_record(location, record, skip):
    skip = set(skip)
    checked, mismatched, missing, not_checked = 0, [], [], []
    with open(os.path.join(location, record), newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    for row in rows:
        if not row:
            continue
        rel, hash_field = row[0], (row[1] if len(row) > 1 else "")
        if os.path.isabs(rel) or not _inside(location, rel):
            not_checked.append(rel)
            continue
        if rel in skip or not hash_field:
            continue
        algo, _, b64 = hash_field.partition("=")
        full = os.path.join(location, rel)
        if algo != "sha256":
            not_checked.append(rel)
            continue
        try:
            actual = _digest(full)
        except FileNotFoundError:
            missing.append(rel)
            continue
        checked += 1
        expected = base64.urlsafe_b64decode(b64 + "=" * (-len(b64) % 4))
        if actual != expected:
            mismatched.append(rel)
    return {"checked": checked, "mismatched": mismatched, "missing": missing, "not_checked": not_checked}


def check_bytecode(location, rel):
    """'' when the cached bytecode exists and is valid for the current source; else why not."""
    source_path = os.path.join(location, rel)
    pyc = importlib.util.cache_from_source(source_path)
    try:
        with open(source_path, "rb") as fh:
            source = fh.read()
        with open(pyc, "rb") as fh:
            header = fh.read(16)
    except FileNotFoundError as exc:
        return f"missing {os.path.relpath(exc.filename, location)}"
    if len(header) < 16 or header[:4] != importlib.util.MAGIC_NUMBER:
        return f"{os.path.relpath(pyc, location)} was not written by this interpreter"
    flags = int.from_bytes(header[4:8], "little")
    if flags & 0b1:
        if header[8:16] != importlib.util.source_hash(source):
            return f"{os.path.relpath(pyc, location)} is stale: its source hash does not match the file"
        if not flags & 0b10:
            return f"{os.path.relpath(pyc, location)} is unchecked-hash bytecode (never revalidated)"
        return ""
    mtime = int(os.stat(source_path).st_mtime) & 0xFFFFFFFF
    size = len(source) & 0xFFFFFFFF
    if header[8:12] != mtime.to_bytes(4, "little") or header[12:16] != size.to_bytes(4, "little"):
        return f"{os.path.relpath(pyc, location)} is stale: timestamp bytecode does not match the file"
    return f"{os.path.relpath(pyc, location)} is timestamp bytecode, expected checked-hash"


def main(request):
    location = request["location"]
    result = check_record(location, request["record"], request.get("skip", []))
    result["bytecode"] = {rel: check_bytecode(location, rel) for rel in request.get("bytecode", [])}
    return result


if __name__ == "__main__":
    json.dump(main(json.loads(sys.argv[1])), sys.stdout)
