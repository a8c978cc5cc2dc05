"""Ship the consumer probe through a target and read its verdict.

The probe runs under the target's own interpreter (`--python` for a local tree, the image's
python3 for an image) on CPU only, with its source passed as an argument: nothing is written
into the target, so an image's committed layer stays exactly the patched files.
"""

from __future__ import annotations

import json
from importlib import resources

from ..errors import EnvironmentProblem
from ..report.model import CensusEntry, ProbeCase, ProbeReport
from ..targets.base import Distribution, Target

PROBE_SCHEMA = "dspark-patch/probe/v1"
PROBE_TIMEOUT_S = 600.0

# The probe must not see a GPU even where one exists: it checks source behaviour on CPU.
_PROBE_ENV = {"CUDA_VISIBLE_DEVICES": "", "PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}


def probe_source() -> str:
    return resources.files(__package__).joinpath("consumer_probe.py").read_text(encoding="utf-8")


def _census_entry(e: dict) -> CensusEntry:
    # A probe naming no census (another patch set's) reports none; a malformed entry is an
    # unreadable verdict (KeyError/TypeError/ValueError, caught by the caller).
    return CensusEntry(
        file=str(e["file"]), line=int(e["line"]), function=str(e["function"]), symbol=str(e["symbol"]),
        kind=str(e["kind"]), reached=bool(e["reached"]), none_safe=bool(e["none_safe"]), verdict=str(e["verdict"]),
    )


def run_probe(target: Target, dist: Distribution, *, timeout: float = PROBE_TIMEOUT_S) -> ProbeReport:
    result = target.run_python(probe_source(), ["--site", dist.location, "--json"], env=_PROBE_ENV, timeout=timeout)
    stderr_tail = result.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    if result.timed_out:
        return ProbeReport(ok=False, ran=True, detail=f"the probe did not finish within {timeout:.0f} s")
    if result.returncode == 3:
        raise EnvironmentProblem(
            f"the probe cannot run with {dist.python}: {stderr_tail[0] or 'torch is not importable'}",
            hint="the target's interpreter needs torch (CPU is enough); or pass --no-probe",
        )
    try:
        doc = json.loads(result.stdout.decode("utf-8"))
        if doc.get("schema") != PROBE_SCHEMA:
            raise ValueError(f"unexpected schema {doc.get('schema')!r}")
        cases = tuple(ProbeCase(name=str(c["name"]), ok=bool(c["ok"]), detail=str(c["detail"])) for c in doc["cases"])
        census = tuple(_census_entry(e) for e in doc.get("census", ()))
    except (ValueError, KeyError, TypeError) as exc:
        return ProbeReport(
            ok=False, ran=True,
            detail=f"the probe exited {result.returncode} without a readable verdict ({exc}); stderr: {stderr_tail[0]}",
        )
    ok = result.returncode == 0 and bool(cases) and all(c.ok for c in cases)
    failed = [c.name for c in cases if not c.ok]
    detail = "" if ok else (f"failing cases: {', '.join(failed)}" if failed else f"probe exited {result.returncode}")
    return ProbeReport(ok=ok, ran=True, cases=cases, census=census, detail=detail)
