"""The tool's containers on the local engine that a test's own runs made or left behind.

Other sessions may share the engine (scripts/test runs the registry tiers beside the engine
tier): a container whose maker is alive and not one of this test process's descendants is
theirs, at work. One whose maker has exited, or is ours, counts.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable

from dspark_patch.targets.docker import DockerEngine
from dspark_patch.targets.docker.naming import Owner


def our_containers(client) -> list[str]:
    """Names of the tool's containers that this test's runs made or left behind."""
    found = []
    for _, name in DockerEngine(client).our_containers():
        owner = Owner.parse(name)
        assert owner is not None
        if owner.here and owner.alive() and not _descends_from_us(owner.pid):
            continue
        found.append(name)
    return found


def left_by(client, *runs) -> list[str]:
    """Names of the tool's containers that these runs (tests/support/cli.py Results) made and
    left: by the owner written in the name (this host, the run's pid and start time), so neither
    a container at work in another session nor one another test's killed run left is counted."""
    wanted = {(r.pid, r.started) for r in runs}
    assert wanted and all(pid > 0 and started != "?" for pid, started in wanted), wanted
    found = []
    for _, name in DockerEngine(client).our_containers():
        owner = Owner.parse(name)
        if owner is not None and owner.here and (owner.pid, owner.start) in wanted:
            found.append(name)
    return found


def _descends_from_us(pid: int) -> bool:
    while pid > 1:
        if pid == os.getpid():
            return True
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            return False
    return False


def on_host(host: str, argv: list[str]) -> list[str]:
    """`argv` under a host name of its own (a UTS namespace; the same pid, as `exec` keeps it).

    The tool removes a container whose maker is gone only when that maker ran on its own host
    (the name says which). Under a name of the test's own, a run in the session beside this one
    (scripts/test runs the registry tiers on the same engine) leaves the killed run's container
    alone, so the run this test starts next is the one that finds it."""
    return ["unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', host, *argv]


def signalled_when(argv: list[str], ready: Callable[[], object], sig: signal.Signals) -> tuple[int, int, str]:
    """Run `argv`, send it `sig` once `ready()` holds (within 120 s, while it runs) and wait for
    its end; returns its pid, exit status and stderr. A run still going after a failed check is
    killed, so it cannot go on to tag or leave anything later."""
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline, "the run never made a container"
            time.sleep(0.05)
        proc.send_signal(sig)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = proc.stderr.read().decode("utf-8", "replace") if proc.stderr else ""
    return proc.pid, proc.returncode, said
