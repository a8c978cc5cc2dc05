"""The engines other than the local dockerd, reached only through DOCKER_HOST.

- `podman`: Podman's Docker-compatible API on a unix socket (scripts/ensure-podman).
- `remote-docker`: a second dockerd with its own data-root on a loopback TCP port
  (scripts/ensure-remote-docker); it shares no filesystem, /proc or process ids the tool may use.

Both are started (and installed) by the project's scripts; images get into them by a pull from
the seed registry (tests/support/seed.py: `pull_into`, skipped when the id is already there),
so that a push from them sends only the layers a registry lacks. A failure to start an engine
fails the tests that need it: they are never skipped.
"""

from __future__ import annotations

import functools
import subprocess
from dataclasses import dataclass

import pytest

from tests.support import images, seed
from tests.support.images import ROOT

SCRIPTS = {"podman": "ensure-podman", "remote-docker": "ensure-remote-docker"}


@dataclass(frozen=True, kw_only=True)
class Engine:
    name: str
    docker_host: str

    @property
    def env(self) -> dict[str, str]:
        """What a command needs in its environment to talk to this engine."""
        return {"DOCKER_HOST": self.docker_host}

    def load(self, ref: str) -> str:
        """Local image `ref` into this engine, pulled from the seed registry (once per image id);
        returns `ref`."""
        seed.pull_into(self.docker_host, ref)
        return ref

    def docker(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The docker CLI against this engine (for checks a test makes on the result)."""
        return subprocess.run(["docker", "--host", self.docker_host, *args],
                              capture_output=True, text=True, check=False)


def _script(name: str, *args: str) -> str:
    done = subprocess.run([str(ROOT / "scripts" / name), *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/{name} failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return done.stdout.strip()


@functools.cache
def engine(name: str) -> Engine:
    """The engine `name` (one of SCRIPTS), started if it is not running."""
    return Engine(name=name, docker_host=_script(SCRIPTS[name]).splitlines()[-1])


@pytest.fixture(scope="session", params=sorted(SCRIPTS))
def fixture_on_other_engine(request: pytest.FixtureRequest) -> tuple[Engine, str]:
    """Each engine that is not the local dockerd in turn, with the fixture image loaded there."""
    other = engine(request.param)
    return other, other.load(images.fixture_image())
