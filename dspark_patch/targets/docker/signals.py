"""SIGTERM as an exception, so `finally` blocks get to remove our containers.

A plain `kill` (or a CI job's cancel) would otherwise end the process without unwinding, and
the container would outlive the run until the next run's clean-up."""

from __future__ import annotations

import signal
import threading
from typing import Any


class terminate_raises:
    """While active, SIGTERM raises SystemExit(143).

    Only the main thread may install signal handlers; elsewhere this does nothing. Not
    re-entrant per instance: each container holds its own."""

    def __init__(self) -> None:
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> terminate_raises:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, _raise_exit)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
