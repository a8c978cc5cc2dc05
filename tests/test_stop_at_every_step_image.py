"""A Ctrl-C (SIGINT) or a cancel (SIGTERM) at every step of `apply --image`, `verify --image` and
`status --image`, on the real engine and fixture image: exit 130 or 143 with one line saying so,
never exit 0, no tag, no container of the run left, the source image untouched.

The signal is a real one, sent by the process to itself as the step begins
(support/stepsignals.py); the signals alternate from step to step (both are sent at every step
of a local tree's run, test_stop_at_every_step.py). Each run has a host name of its own
(support/containers.py `on_host`), so only its own containers are counted. The step lists are
held equal to the steps a clean run takes, so a new step is a step this file must cover.
"""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import docker
import pytest

from dspark_patch.targets.docker import DockerEngine
from tests.support.cli import run
from tests.support.containers import on_host, our_containers
from tests.support.images import fixture_image
from tests.support.stepsignals import SENT, run_signalled_at

pytestmark = pytest.mark.engine

APPLY_STEPS = ("open target", "load patch", "locate", "other copies", "plan", "integrity", "write", "re-read",
               "compile", "layer", "probe", "runtime", "layers", "commit", "tag")
VERIFY_STEPS = ("open target", "load patch", "locate", "patched files", "integrity", "other copies", "runtime",
                "as started", "labels", "layer", "probe")
STATUS_POINTS = ("status: start 1", "status: done 1", "status: start 2", "status: done 2", "status: write")
SAID = {signal.SIGINT: "dspark-patch: interrupted; nothing was committed",
        signal.SIGTERM: "dspark-patch: terminated; nothing was committed"}


def _alternating(steps: tuple[str, ...]) -> list[tuple[str, signal.Signals]]:
    return [(step, (signal.SIGINT, signal.SIGTERM)[i % 2]) for i, step in enumerate(steps)]


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    return docker.from_env()


@pytest.fixture(scope="module")
def patched(client, tmp_path_factory) -> str:
    """The fixture image patched by a clean apply (no probe: verify probes it)."""
    tag = f"dspark-patch/test-stopped:{uuid.uuid4().hex[:10]}"
    res = run("apply", "--image", fixture_image(), "--tag", tag, "--no-probe", "--pull", "never",
              "--report-dir", str(tmp_path_factory.mktemp("patched")))
    assert res.returncode == 0, res.stderr
    yield tag
    client.images.remove(tag, force=True)


def _stopped(client, point: str, sig: signal.Signals, *args: str) -> None:
    """Run ARGS under a host of its own, signalled at `point`; check what a user would see."""
    host = f"dspark-test-{uuid.uuid4().hex[:12]}"
    source_id = client.images.get(fixture_image()).id
    try:
        res = run_signalled_at(point, sig, *args, wrap=lambda argv: on_host(host, argv))
        assert f"{SENT} {sig.name} at {point}" in res.stderr, res.stderr
        assert res.returncode == 128 + sig, (res.returncode, res.stderr)  # never 0
        assert "Traceback" not in res.stderr, res.stderr
        assert res.stderr.strip().splitlines()[-1] == SAID[sig], res.stderr
        assert [n for n in our_containers(client) if f"--{host}--" in n] == []
        assert client.images.get(fixture_image()).id == source_id
    finally:  # a failed check above must not leave a container that no run on this host removes
        engine = DockerEngine(client)
        for container_id, name in engine.our_containers():
            if f"--{host}--" in name:
                engine.remove_container(container_id)


def test_the_steps_covered_here_are_the_steps_a_clean_run_takes(client, patched: str, tmp_path: Path) -> None:
    tag = f"dspark-patch/test-stopped:{uuid.uuid4().hex[:10]}"
    try:
        applied = run("apply", "--image", fixture_image(), "--tag", tag, "--pull", "never", "--json",
                      "--report-dir", str(tmp_path / "a"))
        assert applied.returncode == 0, applied.stderr
        assert tuple(s["name"] for s in applied.json["steps"] if s["status"] != "skipped") == APPLY_STEPS
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass
    verified = run("verify", "--image", patched, "--pull", "never", "--json", "--report-dir", str(tmp_path / "v"))
    assert verified.returncode == 0, verified.stderr
    assert tuple(s["name"] for s in verified.json["steps"] if s["status"] != "skipped") == VERIFY_STEPS
    status = run("status", "--image", patched, "--image", fixture_image(), "--report-dir", str(tmp_path / "s"))
    assert status.returncode == 0, status.stderr


@pytest.mark.parametrize(("step", "sig"), _alternating(APPLY_STEPS), ids=lambda v: getattr(v, "name", v))
def test_a_stop_during_an_image_apply_step_tags_nothing_and_leaves_nothing(client, step, sig, tmp_path):
    tag = f"dspark-patch/test-stopped:{uuid.uuid4().hex[:10]}"
    try:
        _stopped(client, step, sig, "apply", "--image", fixture_image(), "--tag", tag, "--pull", "never",
                 "--report-dir", str(tmp_path / "r"))
        with pytest.raises(docker.errors.ImageNotFound):
            client.images.get(tag)
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass


@pytest.mark.parametrize(("step", "sig"), _alternating(VERIFY_STEPS), ids=lambda v: getattr(v, "name", v))
def test_a_stop_during_an_image_verify_step_is_no_verdict(client, patched, step, sig, tmp_path):
    _stopped(client, step, sig, "verify", "--image", patched, "--pull", "never", "--report-dir", str(tmp_path / "r"))
    assert not (tmp_path / "r" / "audit.json").exists() or '"verified"' not in (tmp_path / "r" / "audit.json").read_text()


@pytest.mark.parametrize(("point", "sig"), _alternating(STATUS_POINTS), ids=lambda v: getattr(v, "name", v))
def test_a_stop_during_image_status_is_no_verdict(client, patched, point, sig, tmp_path):
    _stopped(client, point, sig, "status", "--image", patched, "--image", fixture_image(),
             "--report-dir", str(tmp_path / "r"))
    assert not (tmp_path / "r" / "status.json").exists()
