"""The probe's census as port keeps it: a reader's one line, and the census recorded beside a
variant (the next port's "before" column)."""

from __future__ import annotations

import json
from pathlib import Path

from .. import ownfiles
from ..errors import BadInput, InvalidPatchSet
from ..report.model import CensusEntry


def reader_line(e: CensusEntry) -> str:
    return f"{e.file}:{e.line} {e.function} ({e.symbol}, {e.kind})"


def census_json(census: tuple[CensusEntry, ...]) -> str:
    rows = [{"file": e.file, "line": e.line, "function": e.function, "symbol": e.symbol, "kind": e.kind,
             "reached": e.reached, "none_safe": e.none_safe, "verdict": e.verdict} for e in census]
    return json.dumps({"schema": "dspark-patch/census/v1", "census": rows}, indent=1) + "\n"


def load_census(path: Path) -> tuple[CensusEntry, ...] | None:
    """A census recorded beside a variant when it was made (None: none was recorded), read bounded
    and never through a link (ownfiles.read_json): a patch set may come in a pull request."""
    try:
        doc = ownfiles.read_json(path, limit=16 << 20, what="census")
        return tuple(CensusEntry(**row) for row in doc["census"])
    except ownfiles.MissingFile:
        return None
    except (BadInput, ValueError, KeyError, TypeError) as exc:
        said = exc.message if isinstance(exc, BadInput) else f"{path}: not a recorded census ({exc})"
        raise InvalidPatchSet(said, hint="remove it, or record it again") from None
