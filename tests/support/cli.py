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
    done = subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    return Result(done.returncode, done.stdout, done.stderr)
