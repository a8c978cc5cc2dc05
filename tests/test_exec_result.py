"""How the result of an exec in the work container is read (targets/docker/container.py).

The engine ends an exec's output stream when the process closes it and records the exit a
moment later, from an event handled apart. Under load the two can be read in the other order:
the output is complete, the exec still shows as running and has no exit code yet. A run that
took that `None` for the exit code failed a step whose output was fine (`take_layer` compares
it with 0). The engine's answers are played here by a stand-in: the order cannot be caused on
demand with a real engine (a fault we cannot cause), and everything else about an exec is
tested against the real engine in test_image_target.py.
"""

from __future__ import annotations

import pytest
from docker.utils.socket import frames_iter

from dspark_patch.errors import EnvironmentProblem
from dspark_patch.targets.docker.container import RunningCall, demux

from .support.exec_frames import ended_output, output_of


class Engine:
    """The two calls RunningCall makes: the output, then the exec's state, `running` times
    still running before it has ended with `code`."""

    def __init__(self, out: tuple[bytes | None, bytes | None], *, running: int, code: int = 0) -> None:
        self.out, self.running, self.code = out, running, code
        self.asked = 0

    def exec_start(self, exec_id: str, socket: bool) -> object:
        assert socket
        return output_of(*self.out)

    def exec_inspect(self, exec_id: str) -> dict:
        self.asked += 1
        if self.asked <= self.running:
            return {"Running": True, "ExitCode": None}
        return {"Running": False, "ExitCode": self.code}


def call(engine: Engine) -> RunningCall:
    return RunningCall(engine, "exec-1", program="/usr/bin/python3", timeout=60, wrapped=True)


def test_an_exit_recorded_after_the_output_ended_is_waited_for():
    engine = Engine((b'{"files": []}', None), running=3, code=0)
    result = call(engine).wait()
    assert (result.returncode, result.stdout, result.timed_out) == (0, b'{"files": []}', False)
    assert engine.asked == 4


def test_the_exit_code_read_late_is_the_process_own():
    engine = Engine((None, b"Traceback ...\nSyntaxError: bad\n"), running=2, code=1)
    result = call(engine).wait()
    assert (result.returncode, result.stderr.splitlines()[-1]) == (1, b"SyntaxError: bad")


def test_an_exec_that_never_ends_after_its_output_is_an_environment_problem(monkeypatch):
    monkeypatch.setattr(RunningCall, "EXIT_WAIT_S", 0.3)
    with pytest.raises(EnvironmentProblem, match="never said how it exited"):
        call(Engine((b"", b""), running=10**9)).wait()


def test_timeouts_are_still_told_by_the_exit_code_of_timeout():
    result = call(Engine((b"", b""), running=0, code=124)).wait()
    assert result.timed_out and result.returncode == 124


def test_output_on_stream_0_is_stdout_as_docker_reads_it():
    # Podman sends some of an exec's output framed as stream 0; Docker's own client (stdcopy)
    # writes stream 0 to stdout, and docker-py's demux raised "0 is not a valid stream".
    frames = [(0, b'{"files": '), (1, b'[]}'), (2, b"warning: x\n"), (3, b"engine: y\n")]
    assert demux(frames_iter(ended_output(frames), False)) == (b'{"files": []}', b"warning: x\nengine: y\n")


def test_an_exec_read_on_stream_0_is_whole():
    class Stream0(Engine):
        def exec_start(self, exec_id: str, socket: bool) -> object:
            return ended_output([(0, b'{"files": '), (1, b"[]}")])

    result = call(Stream0((None, None), running=0)).wait()
    assert (result.returncode, result.stdout) == (0, b'{"files": []}')


def test_an_unknown_stream_is_an_environment_problem():
    with pytest.raises(EnvironmentProblem, match="on stream 7"):
        demux(frames_iter(ended_output([(1, b"a"), (7, b"b")]), False))
