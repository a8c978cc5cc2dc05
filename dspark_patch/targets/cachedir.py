"""The project's cache folder on this machine: $DSPARK_PATCH_CACHE, default ~/.cache/dspark-patch.

The wheels and images of scripts/ and tests/ are kept there too; the tool's own parts are
`scans/` (layer scans, targets/layers/cache.py) and `bytecode/` (proofs that a .pyc is what
its interpreter compiles, targets/proofs.py)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_ROOT = "DSPARK_PATCH_CACHE"


def home() -> Path:
    given = os.environ.get(ENV_ROOT, "").strip()
    return Path(given) if given else Path(os.path.expanduser("~")) / ".cache" / "dspark-patch"

