"""The project's cache folder on this machine: $DSPARK_PATCH_CACHE, default ~/.cache/dspark-patch.

The wheels and images of scripts/ and tests/ are kept there too; the tool's own parts are
`scans/` (layer scans, targets/layers/cache.py) and `bytecode/` (proofs that a local tree's
.pyc files are what its interpreter compiles, inside/integrity.py)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_ROOT = "DSPARK_PATCH_CACHE"


def home() -> Path:
    given = os.environ.get(ENV_ROOT, "").strip()
    return Path(given) if given else Path(os.path.expanduser("~")) / ".cache" / "dspark-patch"


def bytecode_proofs() -> Path:
    """The one file of bytecode proofs (each line names its interpreter's identity, so one file
    serves every interpreter of the machine)."""
    return home() / "bytecode" / "proofs"
