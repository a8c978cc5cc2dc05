"""Which module a parallel run (`-n N --dist loadfile`, scripts/test) starts first: the costliest.

xdist's loadfile hands each module to one worker whole (its module fixtures are made once), in
order of how many tests a module has. Test counts say little about time here: 143 quick reads
of hand-made layers against one module fixture that runs 22 probes. A long module handed out
last keeps one worker busy while the other waits. So the controller orders the modules by the
time their tests took in earlier runs on this machine (longest first: the usual greedy rule for
two machines), kept in `$DSPARK_PATCH_CACHE/test-durations.json` (nodeid -> seconds of set-up,
call and teardown; written at the end of every run, merged with what an earlier run knew).
A test it has never seen counts as `UNKNOWN_S`. Only the order changes: every module still runs
whole on one worker, and the file is only ever a hint (unreadable: the count order as before).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections import OrderedDict, defaultdict
from pathlib import Path

import pytest
from xdist.scheduler import LoadFileScheduling

from . import vllm

UNKNOWN_S = 1.0
_seen: dict[str, float] = defaultdict(float)


def durations_file() -> Path:
    return vllm.CACHE / "test-durations.json"


def load() -> dict[str, float]:
    try:
        doc = json.loads(durations_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    return {str(k): float(v) for k, v in doc.items() if isinstance(v, (int, float))}


def record(report: pytest.TestReport) -> None:
    _seen[report.nodeid] += report.duration


def save(config: pytest.Config) -> None:
    """Merge this run's durations into the file (the controller's, or a serial run's)."""
    if hasattr(config, "workerinput") or not _seen:
        return
    known = {**load(), **{k: round(v, 3) for k, v in _seen.items()}}
    path = durations_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".test-durations-")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(known, f, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        return


class CostliestModuleFirst(LoadFileScheduling):
    """loadfile, handing out the modules longest first (by the durations file)."""

    _ordered = False

    def _assign_work_unit(self, node) -> None:  # type: ignore[no-untyped-def]
        if not self._ordered:
            self._ordered = True
            known = load()
            cost = {scope: sum(known.get(nodeid, UNKNOWN_S) for nodeid in unit) for scope, unit in self.workqueue.items()}
            self.workqueue = OrderedDict(sorted(self.workqueue.items(), key=lambda item: -cost[item[0]]))
        super()._assign_work_unit(node)
