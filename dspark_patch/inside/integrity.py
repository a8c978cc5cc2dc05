"""Check an installed distribution against its RECORD, and patched files' bytecode.

Usage: python -B -c SOURCE REQUEST_JSON, where the request is
  {"location": DIR, "record": "vllm-0.33.0.dist-info/RECORD",
   "skip": [paths checked elsewhere (the patched files)], "bytecode": [patched source paths]}
Prints {"checked", "mismatched", "missing", "not_checked", "added", "bytecode": {path: detail-or-""}}.
RECORD entries that point outside the location (a `--target` install records console scripts
as ../../bin/vllm) are listed as not checked and never followed.

What counts as *added* (`added_files`) is shared with `dspark-patch status`, which reads an
image's files without running it and imports this module (stdlib only, no upward import):
a file RECORD does not list inside the distribution's own top-level folders (its packages and
its dist-info), bytecode of a listed module aside; and a `.pth` file in the site folder that no
installed distribution's RECORD lists, because `site` runs such files' import lines at every
interpreter start.
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


def own_folders(record_paths):
    """The top-level folders a distribution installs into (its packages and dist-info)."""
    folders = set()
    for rel in record_paths:
        first, sep, _ = rel.replace("\\", "/").partition("/")
        if sep and first not in ("", ".", ".."):
            folders.add(first)
    return folders


def _bytecode_source(rel):
    """The module a bytecode path belongs to: a/__pycache__/m.cpython-311.pyc -> a/m.py, a/m.pyc -> a/m.py."""
    if not rel.endswith(".pyc"):
        return None
    folder, _, name = rel.rpartition("/")
    parent, _, last = folder.rpartition("/")
    if last == "__pycache__":
        stem = name.split(".", 1)[0]
        return f"{parent + '/' if parent else ''}{stem}.py"
    return rel[:-1]


def added_files(present, listed, folders, pth_listed):
    """Sorted paths (relative to the site folder) that count as added.

    present: files found (own folders' files and the site folder's top-level files);
    listed: paths this distribution's RECORD lists (plus files a patch legitimately adds);
    folders: `own_folders(listed)`; pth_listed: paths any distribution's RECORD lists."""
    listed = set(listed)
    added = []
    for rel in present:
        first, sep, _ = rel.partition("/")
        if not sep:
            if rel.endswith(".pth") and rel not in pth_listed and rel not in listed:
                added.append(rel)
            continue
        if first not in folders or rel in listed:
            continue
        if _bytecode_source(rel) in listed:
            continue
        added.append(rel)
    return sorted(added)


def _present_files(location, folders):
    found = []
    for folder in sorted(folders):
        top = os.path.join(location, folder)
        if os.path.islink(top) or not os.path.isdir(top):
            continue
        for dirpath, dirnames, filenames in os.walk(top):
            rel_dir = os.path.relpath(dirpath, location).replace(os.sep, "/")
            # A symlinked folder is an entry of its own, not a tree to walk into.
            for name in [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
                found.append(f"{rel_dir}/{name}")
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
            found.extend(f"{rel_dir}/{name}" for name in filenames)
    with os.scandir(location) as entries:
        found.extend(e.name for e in entries if e.name.endswith(".pth") and not e.is_dir())
    return found


def _all_record_paths(location):
    """Every path any distribution in the site folder lists in its RECORD."""
    paths: set = set()
    with os.scandir(location) as entries:
        infos = [e.path for e in entries if e.name.endswith(".dist-info") and e.is_dir()]
    for info in infos:
        try:
            with open(os.path.join(info, "RECORD"), newline="", encoding="utf-8") as fh:
                paths.update(row[0] for row in csv.reader(fh) if row)
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
    return paths


def check_added(location, record, extra_listed):
    with open(os.path.join(location, record), newline="", encoding="utf-8") as fh:
        listed = {row[0] for row in csv.reader(fh) if row}
    listed.update(extra_listed)
    folders = own_folders(listed)
    return added_files(_present_files(location, folders), listed, folders, _all_record_paths(location))


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
    result["added"] = check_added(location, request["record"], request.get("skip", []))
    result["bytecode"] = {rel: check_bytecode(location, rel) for rel in request.get("bytecode", [])}
    return result


if __name__ == "__main__":
    json.dump(main(json.loads(sys.argv[1])), sys.stdout)
