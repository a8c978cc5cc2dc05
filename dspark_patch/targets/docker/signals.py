"""SIGTERM as an exception, so `finally` blocks get to remove our containers.

A plain `kill` (or a CI job's cancel) would otherwise end the process without unwinding, and
the container would outlive the run until the next run's clean-up."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from ... import termination


class terminate_raises:
    """While active, SIGTERM raises SystemExit(143).

    Only the main thread may install signal handlers; elsewhere this does nothing. Not
    re-entrant per instance: each container holds its own."""

    def __init__(self) -> None:
        self._previous: Any = None
        self._installed = False

    def __enter__(self) -> terminate_raises:
        if threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, termination.stop)
            self._installed = True
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGTERM, self._previous)
            self._installed = False

    @contextmanager
    def deferred(self) -> Iterator[None]:
        """A SIGTERM that arrives while the block runs (a removal that must finish, or the
        container would outlive the run) is held back and raised as SystemExit when it ends. A
        second one raises at once: an engine that hangs must not make the run unkillable. Where
        this is not active (another thread, or outside its with-block) the block just runs."""
        if not self._installed:
            yield
            return
        held: list[int] = []

        def hold(signum: int, frame: object) -> None:
            termination.record(signum)
            if held:
                raise SystemExit(128 + signum)
            held.append(signum)

        signal.signal(signal.SIGTERM, hold)
        try:
            yield
        finally:
            signal.signal(signal.SIGTERM, termination.stop)
            if held:
                raise SystemExit(128 + held[0])  # the signal outranks what the block raised


@contextmanager
def terminate_sweeps(sweep: Callable[[], object]) -> Iterator[None]:
    """While the block runs, SIGTERM runs `sweep` (the removal of this process's containers)
    and then raises SystemExit(143) in the main thread.

    For work on other threads (a fleet's image readers), where no `finally` of theirs can be
    made to run at once: the main thread removes what they made, by name, wherever they are. A
    second SIGTERM during the sweep ends the run at once; a sweep that fails (the engine gone)
    still ends it. Only the main thread may install signal handlers; elsewhere the block just
    runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: object) -> None:
        termination.record(signum)
        signal.signal(signal.SIGTERM, termination.stop)
        try:
            sweep()
        except Exception:  # noqa: BLE001 - the run ends either way; the next run's gc is left
            pass
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

