"""Ship a patch set's own probe through a target and read its verdict.

The probe is knowledge of one patch, so it lives in the patch set (`probe = "probe.py"` in its
patch.toml); this runner knows only the contract every probe keeps:

- arguments `--site DIR --json`; stdout one JSON object
  `{"schema": "dspark-patch/probe/v1", "ok": bool, "cases": [{"name", "ok", "detail"}, ...], ...}`
  (further top-level keys are the probe's own and are left alone);
- exit 0 every case passed, 1 a case failed, 2 usage error, 3 the interpreter lacks what the
  probe needs (torch, for the DSpark probe).

The probe runs under the target's own interpreter (`--python` for a local tree, the image's
python3 for an image) on CPU only, with its source passed as an argument: nothing is written
into the target, so an image's committed layer stays exactly the patched files.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import EnvironmentProblem
from ..report.model import CensusEntry, ProbeCase, ProbeReport
from ..targets.base import Distribution, Target
from .prestart import EarlyProbe, start_early

PROBE_SCHEMA = "dspark-patch/probe/v1"
PROBE_TIMEOUT_S = 600.0

# The probe must not see a GPU even where one exists: it checks source behaviour on CPU.
_PROBE_ENV = {"CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}


def _census_entry(e: dict) -> CensusEntry:
    # A probe naming no census (another patch set's) reports none; a malformed entry is an
    # unreadable verdict (KeyError/TypeError/ValueError, caught by the caller).
    return CensusEntry(
        file=str(e["file"]), line=int(e["line"]), function=str(e["function"]), symbol=str(e["symbol"]),
        kind=str(e["kind"]), reached=bool(e["reached"]), none_safe=bool(e["none_safe"]), verdict=str(e["verdict"]),
    )


def start_probe_early(target: Target, probe: Path, *, distribution: str,
                      timeout: float = PROBE_TIMEOUT_S) -> EarlyProbe | None:
    """Start the probe's interpreter and imports now, on a target that can (see prestart.py)."""
    source = probe.read_text(encoding="utf-8")
    return start_early(target, source, sources=[source], exclude=[distribution], env=_PROBE_ENV, timeout=timeout)


def run_probe(target: Target, dist: Distribution, probe: Path, *, timeout: float = PROBE_TIMEOUT_S,
              early: EarlyProbe | None = None) -> ProbeReport:
    """Run the probe script `probe` (a patch set's) against `dist` with the target's python
    (handing the go-ahead to `early` if it was started early, else, or if it cannot serve, afresh)."""
    source = probe.read_text(encoding="utf-8")
    args = ["--site", dist.location, "--json"]
    result = early.go(dist, args, timeout=timeout) if early is not None else None
    if result is None:
        result = target.run_python(source, args, env=_PROBE_ENV, timeout=timeout)
    stderr_tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    if result.timed_out:
        return ProbeReport(ok=False, ran=True, detail=f"the probe did not finish within {timeout:.0f} s")
    if result.returncode == 3:
        raise EnvironmentProblem(
            f"the probe {probe.name} cannot run with {dist.python}: {stderr_tail[0] or 'a module it needs is missing'}",
            hint="the target's interpreter needs what the probe imports (torch, CPU build, for DSpark); or pass --no-probe",
        )
    try:
        doc = json.loads(result.stdout.decode("utf-8"))
        if not isinstance(doc, dict) or doc.get("schema") != PROBE_SCHEMA:
            raise ValueError(f"unexpected schema {doc.get('schema') if isinstance(doc, dict) else doc!r}")
        if not isinstance(doc.get("ok"), bool):
            raise ValueError("no boolean 'ok'")
        cases = tuple(ProbeCase(name=str(c["name"]), ok=bool(c["ok"]), detail=str(c["detail"])) for c in doc["cases"])
        census = tuple(_census_entry(e) for e in doc.get("census", ()))
    except (ValueError, KeyError, TypeError) as exc:
        return ProbeReport(
            ok=False, ran=True,
            detail=f"the probe exited {result.returncode} without a readable verdict ({exc}); stderr: {stderr_tail[0]}",
        )
    # Every signal must agree: the exit code, the probe's own verdict and each case.
    ok = result.returncode == 0 and doc["ok"] and bool(cases) and all(c.ok for c in cases)
    failed = [c.name for c in cases if not c.ok]
    if ok:
        detail = ""
    elif failed:
        detail = f"failing cases: {', '.join(failed)}"
    elif not cases:
        detail = f"the probe reported no cases (exit {result.returncode})"
    else:
        detail = f"probe exited {result.returncode} with every case passing; stderr: {stderr_tail[0]}"
    return ProbeReport(ok=ok, ran=True, cases=cases, census=census, detail=detail)
