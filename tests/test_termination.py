"""A SIGTERM whose exception Python drops still stops the run before its next step.

Python runs a signal handler wherever the main thread is, a finaliser included (an HTTP
response closed as it is freed), and an exception raised there is printed and dropped. Under
load a real run once went on, after such a SIGTERM, to commit and tag (exit 0)."""

from __future__ import annotations

import os
import signal
import sys

import pytest

from dspark_patch import termination
from dspark_patch.pipeline.runlog import RunLog
from dspark_patch.report.model import TargetReport
from dspark_patch.targets.docker.signals import terminate_raises


class _SignalledWhenFreed:
    """Sends this process `signum` from its finaliser: the handler runs there, between
    bytecodes, and the exception it raises is dropped."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        total = 0
        for i in range(10_000):  # the handler runs here
            total += i


@pytest.fixture
def dropped(monkeypatch) -> list[BaseException | None]:
    """The exceptions Python drops (raised in a finaliser), collected here."""
    found: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: found.append(u.exc_value))
    return found


@pytest.fixture
def run(monkeypatch, dropped) -> RunLog:
    """A run of a process that was sent no signal yet."""
    monkeypatch.setattr(termination, "_received", None)
    return RunLog.start("apply", TargetReport(kind="image", ref="example"), None)


def test_a_sigterm_dropped_in_a_finaliser_still_stops_the_next_step(run, dropped):
    with terminate_raises():
        _SignalledWhenFreed(signal.SIGTERM)  # freed at once
        # The fault really happened: the handler's SystemExit was dropped, and the code went on.
        assert [type(e) for e in dropped] == [SystemExit]
        with pytest.raises(SystemExit) as stopped, run.step("tag"):
            pytest.fail("a step started after the run was sent SIGTERM")
    assert stopped.value.code == 143
    assert run.steps == []  # the step never started, so it is not in the report either


def test_a_sigterm_during_a_step_fails_that_step_when_it_ends(run):
    with terminate_raises():
        with pytest.raises(SystemExit) as stopped, run.step("commit"):
            _SignalledWhenFreed(signal.SIGTERM)
    assert stopped.value.code == 143
    assert [(s.name, s.status, s.detail) for s in run.steps] == [("commit", "failed", "SystemExit")]


def test_a_run_never_sent_sigterm_runs_its_steps(run):
    with run.step("commit"):
        pass
    assert [(s.name, s.status) for s in run.steps] == [("commit", "ok")]


def test_a_ctrl_c_dropped_in_a_finaliser_still_stops_the_next_step(run, dropped):
    from dspark_patch.cli import _interrupted

    previous = signal.signal(signal.SIGINT, _interrupted)  # as the CLI's main installs it
    try:
        _SignalledWhenFreed(signal.SIGINT)
        assert [type(e) for e in dropped] == [KeyboardInterrupt]
        with pytest.raises(SystemExit) as stopped, run.step("tag"):
            pytest.fail("a step started after the run was interrupted")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped.value.code == 130  # the CLI says "interrupted; nothing was committed" for it
