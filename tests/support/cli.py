"""Run the installed `dspark-patch` console script the way a user does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SCRIPT = Path(sys.executable).with_name("dspark-patch")


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str
    pid: int = 0         # the run's process: the tool names its containers by it
    started: str = "?"   # and by its start time (a pid alone can be reused)

    @property
    def json(self) -> dict:
        return json.loads(self.stdout)

    def assert_clean_error(self, code: int) -> str:
        """Exit `code`, no traceback, and one `dspark-patch: error:` line naming the problem."""
        assert self.returncode == code, (self.returncode, self.stdout, self.stderr)
        assert "Traceback" not in self.stderr and "Traceback" not in self.stdout
        lines = [l for l in self.stderr.splitlines() if l.startswith("dspark-patch: error:")]
        assert len(lines) == 1, self.stderr
        return lines[0]


def run(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 900) -> Result:
    with subprocess.Popen([str(SCRIPT), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          cwd=cwd, env={**os.environ, **(env or {})}) as proc:
        started = start_time(proc.pid)  # not reaped before communicate: /proc still has it
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return Result(proc.returncode, out, err, proc.pid, started)


def start_time(pid: int) -> str:
    """The process's start time as /proc gives it (field 22), "?" when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[19]
    except OSError:
        return "?"
