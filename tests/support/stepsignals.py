"""Send `dspark-patch` a real signal while a chosen step of its run is under way.

Run as a script, `python stepsignals.py STEP SIGNAL ARGS...` runs the command line ARGS as the
console script does, with the step of that name (pipeline/runlog.py `RunLog.step`) wrapped so
that the process sends itself SIGNAL (INT or TERM) as the step's body begins: what a Ctrl-C or a
cancelled CI job does in the middle of that step, by the same kernel delivery, with no line of
the tool changed for it. A run that never reaches STEP exits as it would have (the test then
fails on the missing signal, since the list of steps it names is the list a clean run takes).

`status` has no named steps; its points are `status: start N` and `status: done N` (as the N-th
target's read begins, and once its row is made: the progress events of status/fleet.py) and
`status: write` (as the report set is written).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

SCRIPT = Path(__file__).resolve()
SENT = "stepsignals: sent"  # on stderr, so a test can tell the signal was sent at all


def run_signalled_at(step: str, signum: signal.Signals, *args: str, env: dict[str, str] | None = None,
                     wrap: Callable[[list[str]], list[str]] = list,
                     timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`dspark-patch ARGS`, sent `signum` as its step `step` begins; `wrap` puts the command line
    under another (support/containers.py `on_host`)."""
    # The child gets the default SIGINT and SIGTERM whatever this process was started with (a CI
    # job in the background ignores SIGINT, and an ignored signal is inherited).
    return subprocess.run(wrap([sys.executable, str(SCRIPT), step, signum.name, *args]), capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})},
                          preexec_fn=_default_signals)


def _default_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def _send(signum: int, where: str) -> None:
    print(f"{SENT} {signal.Signals(signum).name} at {where}", file=sys.stderr, flush=True)
    os.kill(os.getpid(), signum)


def _arm_status(point: str, signum: int) -> None:
    from dspark_patch.cli import status as status_cli
    from dspark_patch.status import fleet

    run_status, write = fleet.status, status_cli._write

    def status(request, *, on_progress=None):  # type: ignore[no-untyped-def]
        seen: list[str] = []

        def progress(ref, event, row):  # type: ignore[no-untyped-def]
            seen.append(event)
            if on_progress is not None:
                on_progress(ref, event, row)
            if f"status: {event} {seen.count(event)}" == point:
                _send(signum, point)

        return run_status(request, on_progress=progress)

    def written(*args, **kwargs):  # type: ignore[no-untyped-def]
        if point == "status: write":
            _send(signum, point)
        return write(*args, **kwargs)

    fleet.status, status_cli._write = status, written  # type: ignore[assignment]


def _arm(step_name: str, signum: int) -> None:
    if step_name.startswith("status: "):
        _arm_status(step_name, signum)
        return
    from dspark_patch.pipeline.runlog import RunLog

    original = RunLog.step

    @contextmanager
    def step(self: RunLog, name: str, **how: bool) -> Iterator[None]:
        with original(self, name, **how):
            if name == step_name:
                _send(signum, name)
            yield

    RunLog.step = step  # type: ignore[method-assign]


if __name__ == "__main__":
    _arm(sys.argv[1], getattr(signal, "SIG" + sys.argv[2].removeprefix("SIG")))
    sys.argv = ["dspark-patch", *sys.argv[3:]]
    from dspark_patch.cli import main

    sys.exit(main())
