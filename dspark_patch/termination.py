"""The SIGTERM a run was sent, remembered until the run ends.

SIGTERM is turned into SystemExit where the tool holds containers (targets/docker/signals.py),
but Python runs a signal handler wherever the main thread is, a finaliser included (an HTTP
response closed as it is freed), and an exception raised there is printed and dropped: the run
would go on to commit and tag. So the handler also records the signal here, and every step of a
run asks (`check`) before it starts and once it ends: a run told to stop never starts another
step, whatever swallowed the exception."""

from __future__ import annotations

_received: int | None = None


def record(signum: int) -> None:
    """Remember that `signum` ended the run (the first one counts)."""
    global _received
    if _received is None:
        _received = signum


def stop(signum: int, frame: object) -> None:
    """A SIGTERM handler: remember the signal, then end the run as SystemExit(128 + signal), so
    `finally` blocks (a local tree's rollback, our containers' removal) run on the way out."""
    record(signum)
    raise SystemExit(128 + signum)


def check() -> None:
    """Raise SystemExit(128 + signal) if the run was told to stop."""
    if _received is not None:
        raise SystemExit(128 + _received)


def received() -> int | None:
    """The signal the run was sent, if any."""
    return _received
