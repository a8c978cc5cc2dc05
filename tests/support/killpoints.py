"""Kill `dspark-patch` for real at a chosen point of a run (tests/test_root_journal.py).

Run as a script, `python killpoints.py EVENT MATCH N ARGS...` runs the command line ARGS as the
console script does, with an audit hook (PEP 578) that sends the process SIGKILL right before the
N-th audit event EVENT whose argument holds MATCH: for `os.rename` (os.replace raises it too) the
destination, for `subprocess.Popen` the argv. Audit events fire before the operation, so
`os.rename /vllm/ 2` ends the process with the first file of the plan renamed into place and the
second one's temporary file written: what an OOM kill or a cancelled CI job does between two
renames, done the same way (a real SIGKILL), with no line of the tool changed for it.

`fake_python` makes the other kind of kill point: an interpreter that is the real one, except
that the patch set's probe (its argv carries `--site`) waits until the test writes a verdict
file, so the test can kill the whole process group while the probe runs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve()

# The probe's verdicts the fake interpreter knows: "pass" prints a passing verdict, "missing"
# answers as an interpreter without torch does (exit 3), "real" runs the patch set's own probe.
_FAKE = """#!/bin/sh
for a in "$@"; do
  if [ "$a" = "--site" ]; then
    echo "$$" >> '{control}/probe-started'
    while [ ! -e '{control}/verdict' ]; do sleep 0.05; done
    case "$(cat '{control}/verdict')" in
      pass) echo '{{"schema": "dspark-patch/probe/v1", "ok": true, "cases": [{{"name": "stand-in", "ok": true, "detail": "the test said pass"}}]}}'; exit 0 ;;
      missing) echo "ModuleNotFoundError: No module named 'torch'" >&2; exit 3 ;;
      real) exec '{real}' "$@" ;;
    esac
    echo "unknown verdict" >&2; exit 2
  fi
done
exec '{real}' "$@"
"""


def fake_python(where: Path, control: Path) -> Path:
    """An interpreter at `where` that runs as this one, its probe held until `control/verdict` exists."""
    where.parent.mkdir(parents=True, exist_ok=True)
    control.mkdir(parents=True, exist_ok=True)
    where.write_text(_FAKE.format(control=control, real=sys.executable))
    where.chmod(0o755)
    return where


def probes_started(control: Path) -> int:
    started = control / "probe-started"
    return len(started.read_text().split()) if started.exists() else 0


def run_killed_at(event: str, match: str, n: int, *args: str, cwd: Path | None = None,
                  timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`dspark-patch ARGS`, killed by SIGKILL before the N-th `event` holding `match` (returncode
    -9), or its own exit when the run never gets there."""
    return subprocess.run([sys.executable, str(SCRIPT), event, match, str(n), *args], capture_output=True,
                          text=True, cwd=cwd, timeout=timeout)


def _arm(event: str, match: str, n: int) -> None:
    seen = 0

    def hook(name: str, args: tuple) -> None:
        nonlocal seen
        if name != event:
            return
        subject = args[1]  # os.rename: (src, dst, …); subprocess.Popen: (executable, argv, …)
        text = " ".join(map(os.fsdecode, subject)) if isinstance(subject, list | tuple) else os.fsdecode(subject)
        if match in text:
            seen += 1
            if seen == n:
                sys.stdout.flush()
                os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)


if __name__ == "__main__":
    _arm(sys.argv[1], sys.argv[2], int(sys.argv[3]))
    sys.argv = ["dspark-patch", *sys.argv[4:]]
    from dspark_patch.cli import main

    sys.exit(main())
