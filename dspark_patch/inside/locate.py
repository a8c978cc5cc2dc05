"""Find an installed distribution without importing it. Standard library only.

This file runs in two places: imported by the local-tree target, and shipped as source to a
container's own interpreter (`python3 -B -c SOURCE NAME`) by the image target, which reads the
one JSON line it prints. Importing the distribution would run its code (vLLM's import pulls in
torch, CUDA probing, plugins), so only `importlib.util.find_spec` on the top-level name and
`importlib.metadata` are used: neither executes the package.
"""

from __future__ import annotations

import base64
import importlib.metadata
import importlib.util
import json
import os
import platform
import sys


def _hex_sha256(file_hash: object) -> str | None:
    # RECORD stores "sha256=<urlsafe base64, no padding>" (PEP 376 / the wheel spec).
    if file_hash is None or getattr(file_hash, "mode", None) != "sha256":
        return None
    value = file_hash.value  # type: ignore[attr-defined]
    return base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)).hex()


def record_of(dist: importlib.metadata.Distribution) -> tuple[str | None, list]:
    """RECORD's path relative to the location (or None) and its rows as [path, sha256, size]."""
    record, record_file = [], None
    for entry in dist.files or ():
        record.append([str(entry), _hex_sha256(entry.hash), entry.size])
        if str(entry).endswith(".dist-info/RECORD"):
            record_file = str(entry)
    return record_file, record


def locate(name: str) -> dict:
    """Describe distribution `name` as this interpreter sees it.

    Returns a JSON-ready dict: always `found`, `python`, `python_version`, `sys_path`; when
    found also `name`, `version`, `location`, `package_dir`, `record_file` (RECORD's path
    relative to `location`, or None) and `record` ([path, sha256, size]).
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
    record_file, record = record_of(dist)
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
