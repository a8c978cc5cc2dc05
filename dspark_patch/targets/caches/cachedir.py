"""The project's cache folder on this machine: $DSPARK_PATCH_CACHE, default ~/.cache/dspark-patch.

The wheels and images of scripts/ and tests/ are kept there too; the tool's own parts are
`scans/` (layer scans, targets/caches/scans.py), `bytecode/` (proofs that a .pyc is what
its interpreter compiles, targets/caches/proofs.py) and `answers/` (an image's answers to read-only
checks, kept by image id, targets/caches/answers.py)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

ENV_ROOT = "DSPARK_PATCH_CACHE"


def home() -> Path:
    given = os.environ.get(ENV_ROOT, "").strip()
    return Path(given) if given else Path(os.path.expanduser("~")) / ".cache" / "dspark-patch"



def write_atomic(path: Path, data: bytes, *, suffix: str = "") -> None:
    """Write `data` to `path` through a temporary file in its folder and `os.replace`: a reader
    (another run) sees the old file or the new one, never half of one. Raises OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=suffix)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(temp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise
