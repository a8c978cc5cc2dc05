"""scripts/ensure-podman: a service that answers pings but cannot run a container, or a socket a
dead service left, is restarted; a healthy one is left alone.

Each case runs the script against a service of its own (DSPARK_PATCH_PODMAN_DIR in a temporary
folder), never the shared one the other Podman tests use. The faulty service is a real
`podman system service` started with raised default ulimits, which this kind of machine (a
container) refuses at every container start while `/_ping` still says OK: the shape of the
`write child: broken pipe` failure a long-lived service once had in CI."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.support.images import ROOT

pytestmark = pytest.mark.podman

SCRIPT = ROOT / "scripts" / "ensure-podman"


def _ensure(run_dir: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DSPARK_PATCH_PODMAN_DIR": str(run_dir), "DSPARK_PATCH_PODMAN_LOG": str(run_dir / "log"),
           "DSPARK_PATCH_PODMAN_WAIT": "30"}
    return subprocess.run([str(SCRIPT)], capture_output=True, text=True, env=env, timeout=300, check=False)


def _pid(run_dir: Path) -> int:
    return int((run_dir / "service.pid").read_text())


def _runs_a_container(host: str) -> bool:
    done = subprocess.run(["docker", "--host", host, "run", "--rm", "--network", "none",
                           "localhost/dspark-patch/podman-health:1", "/bin/true"], capture_output=True, text=True, check=False)
    return done.returncode == 0


def _stop(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        pass


def test_a_broken_or_dead_service_is_restarted_and_a_healthy_one_kept(tmp_path: Path) -> None:
    run_dir = tmp_path / "podman"
    started: list[int] = []
    try:
        first = _ensure(run_dir)
        assert first.returncode == 0, first.stderr
        host = first.stdout.strip().splitlines()[-1]
        assert host == f"unix://{run_dir}/podman.sock" and _runs_a_container(host)
        started.append(_pid(run_dir))

        # Healthy: left alone (same process), and the health check left no container behind.
        again = _ensure(run_dir)
        assert again.returncode == 0 and "restarting" not in again.stderr and "starting" not in again.stderr, again.stderr
        assert _pid(run_dir) == started[-1]
        names = subprocess.run(["docker", "--host", host, "ps", "-a", "--format", "{{.Names}}"],
                               capture_output=True, text=True, check=True).stdout
        assert "dspark-podman-health" not in names

        # Dead, its socket left behind: started afresh.
        os.kill(started[-1], signal.SIGKILL)
        _wait_gone(started[-1])
        assert (run_dir / "podman.sock").exists()
        dead = _ensure(run_dir)
        assert dead.returncode == 0 and "starting podman system service" in dead.stderr, dead.stderr
        started.append(_pid(run_dir))
        assert started[-1] != started[-2] and _runs_a_container(host)

        # Answers pings, cannot start a container: restarted.
        _stop(started[-1])
        for _ in range(40):
            if subprocess.run(["curl", "-sf", "--max-time", "2", "--unix-socket", str(run_dir / "podman.sock"), "http://d/_ping"],
                              capture_output=True, check=False).returncode != 0:
                break
            time.sleep(0.5)
        (run_dir / "podman.sock").unlink(missing_ok=True)
        broken = tmp_path / "broken.conf"
        broken.write_text('[containers]\ndefault_ulimits = ["nofile=1073741816:1073741816"]\n')
        faulty = subprocess.Popen(["podman", "system", "service", "--time=0", host], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                  env={**os.environ, "CONTAINERS_CONF": str(broken)})
        started.append(faulty.pid)
        (run_dir / "service.pid").write_text(f"{faulty.pid}\n")
        for _ in range(60):
            if subprocess.run(["curl", "-sf", "--max-time", "2", "--unix-socket", str(run_dir / "podman.sock"), "http://d/_ping"],
                              capture_output=True, check=False).returncode == 0:
                break
            time.sleep(0.5)
        assert not _runs_a_container(host)   # the fault is real: pings answer, containers do not start
        fixed = _ensure(run_dir)
        assert fixed.returncode == 0 and "cannot run a container; restarting it" in fixed.stderr, fixed.stderr
        faulty.wait(timeout=30)
        started.append(_pid(run_dir))
        assert started[-1] != faulty.pid and _runs_a_container(host)
    finally:
        for pid in started:
            _stop(pid)


def _wait_gone(pid: int) -> None:
    """Until process `pid` has ended (gone, or a zombie nobody reaped yet): the kill has landed."""
    for _ in range(600):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return
        if state == "Z":
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still runs 30 s after SIGKILL")
