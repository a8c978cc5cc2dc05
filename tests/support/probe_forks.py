"""Many probe runs for one test module: the interpreter and its torch import once, a fork per run.

A probe run is a fresh interpreter that imports torch (about 1.6 s of CPU here) and then runs its
cases on one tree (about 0.5 s). The mutant modules probe some forty trees; on the two cores
that the fast tier shares, their torch imports were most of its time. Here one interpreter,
started as the tool starts the probe's (`-I -B`, the probe's environment), imports torch and
then forks a child per run: the child takes the run's arguments and environment, points its
stdout and stderr at files, and runs the very source the tool hands `python -c` (the bundled
probe). What differs from the tool's own run is only who imported torch.

`probe_many` runs the tool's pipeline in this process (`pipeline.probe`: locate, the probe step,
the report and its exit code, exactly as `dspark-patch probe --root --json` builds them), with
the local target's `run_python` served by the forks. Its first two trees also go through the
real command line, and the two answers must be the same verdict: the harness cannot drift from
what a user runs without the mutant tests failing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from dspark_patch.inside import ISOLATED
from dspark_patch.pipeline import LocalSpec, ProbeRequest
from dspark_patch.pipeline import probe as pipeline_probe
from dspark_patch.probe.run import _PROBE_ENV
from dspark_patch.report import render
from dspark_patch.targets.base import RunResult
from dspark_patch.targets.local_tree import NEUTRAL_CWD, LocalTree
from tests.support import probe_trees

PYTHON = probe_trees.PYTHON  # the venv's interpreter, as the command line's runs use

# Reads one JSON request a line: fork, run `source` as `python -c source *args` would (as
# __main__, SystemExit's code or message as the exit), answer {"code": exit status}.
_ZYGOTE = r'''
import json, os, signal, sys, traceback
import torch  # the import every run shares

for line in sys.stdin:
    req = json.loads(line)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.dup2(os.open(req["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 1)
            os.dup2(os.open(req["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            sys.stdin = open(0, closefd=False)
            os.environ.clear()
            os.environ.update(req["env"])
            sys.argv = ["-c", *req["args"]]
            signal.alarm(max(1, int(req["timeout"])))
            try:
                exec(compile(req["source"], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
                code = 0
            except SystemExit as exc:
                if exc.code is None or isinstance(exc.code, int):
                    code = exc.code or 0
                else:
                    print(exc.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"code": os.waitstatus_to_exitcode(status)}), flush=True)
'''


class Forks:
    """One interpreter that has imported torch; `run_python` forks it for each run (one at a time)."""

    def __init__(self) -> None:
        self._env = {**os.environ, **_PROBE_ENV}
        self._dir = tempfile.TemporaryDirectory(prefix="dspark-patch-forks-")
        self._lock = threading.Lock()
        self._proc = subprocess.Popen([PYTHON, *ISOLATED, "-c", _ZYGOTE], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=self._env, cwd=NEUTRAL_CWD)

    def run_python(self, source: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
                   timeout: float = 600.0) -> RunResult:
        with self._lock:
            out, err = Path(self._dir.name) / "stdout", Path(self._dir.name) / "stderr"
            assert self._proc.stdin is not None and self._proc.stdout is not None
            self._proc.stdin.write(json.dumps({"source": source, "args": list(args), "stdout": str(out),
                                               "stderr": str(err), "env": {**self._env, **(env or {})},
                                               "timeout": timeout}) + "\n")
            self._proc.stdin.flush()
            reply = self._proc.stdout.readline()
            assert reply, f"the probe's forking interpreter ended (exit {self._proc.poll()})"
            code = json.loads(reply)["code"]
            return RunResult(returncode=code, stdout=out.read_bytes(), stderr=err.read_bytes(),
                             timed_out=code == -signal.SIGALRM)

    def close(self) -> None:
        if self._proc.stdin is not None:
            self._proc.stdin.close()
        self._proc.wait(timeout=60)
        self._dir.cleanup()


@contextmanager
def forked_local_runs() -> Iterator[Forks]:
    """While open, every local target in this process runs its interpreter through the forks."""
    forks = Forks()
    original = LocalTree.run_python

    def run_python(self: LocalTree, source: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
                   timeout: float = 600.0) -> RunResult:
        assert self.python == PYTHON, "the forks are this interpreter's"
        return forks.run_python(source, args, env=env, timeout=timeout)

    LocalTree.run_python = run_python  # type: ignore[method-assign]
    try:
        yield forks
    finally:
        LocalTree.run_python = original  # type: ignore[method-assign]
        forks.close()


def _in_process(tree: Path) -> tuple[int, dict]:
    report = pipeline_probe(ProbeRequest(target=LocalSpec(root=str(tree), python=PYTHON), patch=None))
    return report.exit_code, json.loads(render.to_json(report))


def _verdict(outcome: tuple[int, dict]) -> tuple[int, str, list, list, list]:
    code, doc = outcome
    return (code, doc["status"], doc["probe"]["cases"], doc["probe"].get("census", []),
            [e["message"] for e in doc["errors"]])


def probe_many(trees: Mapping[str, Path]) -> dict[str, tuple[int, dict]]:
    """`dspark-patch probe --root T --json` of each tree: exit code and report. The first two
    also through the command line: the same verdict both ways, or this fails."""
    names = list(trees)
    with forked_local_runs():
        outcomes = {name: _in_process(trees[name]) for name in names}
    for name in names[:2]:
        by_cli = probe_trees.probe(trees[name], trees[name].parent / "report")
        assert _verdict(by_cli) == _verdict(outcomes[name]), (name, by_cli, outcomes[name])
        outcomes[name] = by_cli
    return outcomes
