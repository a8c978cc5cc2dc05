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


class _FreedWhileTerminated:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        total = 0
        for i in range(10_000):  # the handler runs here, between bytecodes; its exception is dropped
            total += i


def test_a_sigterm_dropped_in_a_finaliser_still_stops_the_next_step(monkeypatch):
    monkeypatch.setattr(termination, "_received", None)
    dropped: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_value))
    run = RunLog.start("apply", TargetReport(kind="image", ref="example"), None)
    with terminate_raises():
        _FreedWhileTerminated()  # freed at once
        # The fault really happened: the handler's SystemExit was dropped, and the code went on.
        assert [type(e) for e in dropped] == [SystemExit]
        with pytest.raises(SystemExit) as stopped, run.step("tag"):
            pytest.fail("a step started after the run was sent SIGTERM")
    assert stopped.value.code == 143
    assert run.steps == []  # the step never started, so it is not in the report either


def test_a_sigterm_during_a_step_fails_that_step_when_it_ends(monkeypatch):
    monkeypatch.setattr(termination, "_received", None)
    monkeypatch.setattr(sys, "unraisablehook", lambda u: None)
    run = RunLog.start("apply", TargetReport(kind="image", ref="example"), None)
    with terminate_raises():
        with pytest.raises(SystemExit) as stopped, run.step("commit"):
            _FreedWhileTerminated()
    assert stopped.value.code == 143
    assert [(s.name, s.status, s.detail) for s in run.steps] == [("commit", "failed", "SystemExit")]


def test_a_run_never_sent_sigterm_runs_its_steps(monkeypatch):
    monkeypatch.setattr(termination, "_received", None)
    run = RunLog.start("apply", TargetReport(kind="image", ref="example"), None)
    with run.step("commit"):
        pass
    assert [(s.name, s.status) for s in run.steps] == [("commit", "ok")]


class _FreedWhileInterrupted:
    def __del__(self) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        total = 0
        for i in range(10_000):
            total += i


def test_a_ctrl_c_dropped_in_a_finaliser_still_stops_the_next_step(monkeypatch):
    from dspark_patch.cli import _interrupted

    monkeypatch.setattr(termination, "_received", None)
    dropped: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: dropped.append(u.exc_value))
    run = RunLog.start("apply", TargetReport(kind="image", ref="example"), None)
    previous = signal.signal(signal.SIGINT, _interrupted)  # as the CLI's main installs it
    try:
        _FreedWhileInterrupted()
        assert [type(e) for e in dropped] == [KeyboardInterrupt]
        with pytest.raises(SystemExit) as stopped, run.step("tag"):
            pytest.fail("a step started after the run was interrupted")
    finally:
        signal.signal(signal.SIGINT, previous)
    assert stopped.value.code == 130  # the CLI says "interrupted; nothing was committed" for it
