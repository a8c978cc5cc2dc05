"""Make a wheel's reference: every file it installs, with its sha256 and size, from the wheel itself.

Usage: python -m dspark_patch.references.build WHEEL... [--out DIR]  (scripts/make-reference)

The wheel's RECORD is cross-checked against the bytes in the zip: every member but RECORD must
be listed with its own sha256 and size, and every listed file must be a member; any
disagreement stops with an error, so a reference is never taken from a wheel that lies about
itself. The wheel's RECORD is left out of the reference (an installer rewrites it: it adds
INSTALLER, REQUESTED, direct_url.json and the console scripts). The console scripts the wheel
declares (its entry_points.txt, `scripts`: name -> "module:attr") are kept, so that an installed
script can be held to its entry point (references/installer.py).

Output: `<name>-<version>-<python tag>-<abi tag>-<platform tag>.json.gz`, gzip with no
timestamp, so the same wheel always gives the same bytes.
"""

from __future__ import annotations

import base64
import csv
import gzip
import hashlib
import io
import json
import sys
import zipfile
from pathlib import Path

from .installer import entry_points


class WheelDisagrees(Exception):
    """The wheel's RECORD does not match the files in it."""


def _hex(field: str) -> str:
    algo, _, value = field.partition("=")
    if algo != "sha256" or not value:
        raise WheelDisagrees(f"RECORD hash {field!r} is not sha256=…")
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def reference_from_wheel(path: Path) -> dict:
    """The reference document of one wheel (see the module doc)."""
    stem = path.name.removesuffix(".whl")
    name, version, *tags = stem.split("-")
    with zipfile.ZipFile(path) as zf:
        records = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD") and n.count("/") == 1]
        if len(records) != 1:
            raise WheelDisagrees(f"{path.name}: {len(records)} dist-info RECORD files, expected one")
        record_name = records[0]
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode("utf-8"))))
        listed: dict[str, tuple[str, int]] = {}
        for row in rows:
            if not row or row[0] == record_name:
                continue
            if len(row) != 3 or not row[1] or not row[2].isdigit():
                raise WheelDisagrees(f"{path.name}: RECORD row {row!r} has no hash and size")
            listed[row[0]] = (_hex(row[1]), int(row[2]))
        files: dict[str, list] = {}
        for info in zf.infolist():
            if info.is_dir() or info.filename == record_name:
                continue
            digest = hashlib.sha256()
            with zf.open(info) as fh:
                for chunk in iter(lambda: fh.read(1 << 20), b""):
                    digest.update(chunk)
            entry = (digest.hexdigest(), info.file_size)
            if listed.get(info.filename) != entry:
                raise WheelDisagrees(f"{path.name}: {info.filename} is {entry}, RECORD says {listed.get(info.filename)}")
            files[info.filename] = list(entry)
        unlisted = sorted(set(listed) - set(files))
        if unlisted:
            raise WheelDisagrees(f"{path.name}: RECORD lists {unlisted[:3]} that the wheel does not hold")
        points = record_name.replace("/RECORD", "/entry_points.txt")
        scripts = entry_points(zf.read(points).decode("utf-8")) if points in files else {}
        wheel_tags = [line.split(":", 1)[1].strip() for line in
                      zf.read(record_name.replace("/RECORD", "/WHEEL")).decode("utf-8").splitlines()
                      if line.startswith("Tag:")]
    return {"distribution": name, "release": version, "tag": "-".join(tags), "wheel": path.name,
            "wheel_tags": wheel_tags, "scripts": dict(sorted(scripts.items())), "files": dict(sorted(files.items()))}


def encode(document: dict) -> bytes:
    text = json.dumps(document, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return gzip.compress(text, compresslevel=9, mtime=0)


def file_name(document: dict) -> str:
    return f"{document['distribution']}-{document['release']}-{document['tag']}.json.gz"


def main(argv: list[str]) -> int:
    out = Path(__file__).parent
    wheels = []
    args = iter(argv)
    for arg in args:
        if arg == "--out":
            out = Path(next(args))
        else:
            wheels.append(Path(arg))
    if not wheels:
        sys.stderr.write("usage: python -m dspark_patch.references.build WHEEL... [--out DIR]\n")
        return 2
    for wheel in wheels:
        try:
            document = reference_from_wheel(wheel)
        except (WheelDisagrees, zipfile.BadZipFile, OSError, UnicodeDecodeError, csv.Error) as exc:
            sys.stderr.write(f"{wheel}: {exc}\n")
            return 1
        target = out / file_name(document)
        target.write_bytes(encode(document))
        sys.stdout.write(f"{target}: {len(document['files'])} files\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
