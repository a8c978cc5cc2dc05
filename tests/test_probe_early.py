"""The probe started early (probe/prestart.py) on a real engine and the real fixture image.

`apply --image` starts the probe's interpreter and its torch import in the work container
right after loading the patch set, and hands it the go-ahead once the layer is taken. What a
user relies on: the verdict is the one a fresh probe run gives on the patched image, and a run
that stops while the early probe waits (a failed compile, SIGTERM, Ctrl-C) leaves no container,
no tag and no process behind.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import signal
import subprocess
import tarfile
import time
import uuid
from pathlib import Path

import docker
import pytest

from dspark_patch.targets.base import HANDSHAKE_PREFIX
from dspark_patch.targets.docker import DockerEngine
from dspark_patch.targets.docker.naming import Owner
from tests.support.cli import SCRIPT, run
from tests.support.images import fixture_image

pytestmark = pytest.mark.engine

MARK = b"dspark-patch-prestart"  # the first words of the early process's source (its argv)
UNUSED = "the probe started early could not be used"
PATCH_SET = Path(__file__).resolve().parents[1] / "patches" / "dspark-skip-mtp-buffer"


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    return docker.from_env()


@pytest.fixture
def tag(client):
    name = f"dspark-patch/test-early:{uuid.uuid4().hex[:10]}"
    yield name
    try:
        client.images.remove(name, force=True)
    except docker.errors.ImageNotFound:
        pass


def containers_of(client, pid: int) -> list[str]:
    """Ids of the containers of ours that process `pid` made."""
    return [cid for cid, name in DockerEngine(client).our_containers()
            if (owner := Owner.parse(name)) is not None and owner.here and owner.pid == pid]


def early_processes(container_ids: list[str]) -> list[int]:
    """Processes on this host running the early probe inside one of `container_ids`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            cgroup = (entry / "cgroup").read_text()
        except OSError:
            continue
        if MARK in cmdline and any(cid in cgroup for cid in container_ids):
            found.append(int(entry.name))
    return found


def image_exists(client, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


def _verdict(report: dict) -> tuple:
    probe = report["probe"]
    return probe["ok"], [(c["name"], c["ok"], c["detail"]) for c in probe["cases"]], probe["census"]


def test_the_early_probe_gives_the_verdict_of_a_fresh_probe_of_the_result(client, tag, tmp_path):
    applied = run("apply", "--image", fixture_image(), "--tag", tag, "--json", "--report-dir", str(tmp_path / "a"))
    assert applied.returncode == 0, applied.stderr
    assert not any(UNUSED in n for n in applied.json["notes"]), applied.json["notes"]  # it served
    fresh = run("probe", "--image", tag, "--json", "--report-dir", str(tmp_path / "p"))
    assert fresh.returncode == 0, fresh.stderr
    assert _verdict(applied.json) == _verdict(fresh.json)
    assert applied.json["probe"]["ok"] and len(applied.json["probe"]["cases"]) >= 20


def _watch(proc: subprocess.Popen, client, *, until_early: bool) -> tuple[list[str], bool]:
    """Poll the run's containers and early processes until it ends (or, with `until_early`,
    until its early probe is seen waiting). Returns (container ids seen, early probe seen)."""
    seen: list[str] = []
    early = False
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        seen += [c for c in containers_of(client, proc.pid) if c not in seen]
        early = early or bool(seen and early_processes(seen))
        if early and until_early:
            break
        time.sleep(0.02)
    return seen, early


def _review_envs_post(client, patch_set: Path, work: Path) -> None:
    """Write into `patch_set`'s patch.toml the sha256 of vllm/envs.py as its diff makes it from
    the fixture image's file (GNU patch, on that one entry): the hashes a reviewer would record."""
    container = client.containers.create(fixture_image(), entrypoint=["/nothing-runs"], network_disabled=True)
    try:
        stream, _ = container.get_archive("/usr/local/lib/python3.11/dist-packages/vllm/envs.py")
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            member = tar.extractfile(tar.getmembers()[0])
            assert member is not None
            pre = member.read()
    finally:
        container.remove(force=True)
    (work / "vllm").mkdir(parents=True)
    (work / "vllm" / "envs.py").write_bytes(pre)
    text = (patch_set / "vllm-0.33.0.patch").read_text()
    entry = text[:text.index("--- a/", 1)] if text.count("--- a/") > 1 else text
    assert entry.startswith("--- a/vllm/envs.py\n")
    subprocess.run(["patch", "-p1", "-s", "-d", str(work)], input=entry.encode(), check=True)
    post = hashlib.sha256((work / "vllm" / "envs.py").read_bytes()).hexdigest()
    toml = patch_set / "patch.toml"
    reviewed = "ac2b2ddc8eac23000f065610af9919334bc2d37705c3a856ba4b0e2124462a7a"  # the genuine envs.py post-image
    assert toml.read_text().count(reviewed) == 1
    toml.write_text(toml.read_text().replace(reviewed, post))


def _nothing_left(client, seen: list[str], tag: str, pid: int) -> None:
    assert containers_of(client, pid) == []
    for cid in seen:
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(cid)
    assert early_processes(seen) == []
    assert not image_exists(client, tag)


def _go_ahead_written(container_ids: list[str]) -> bool:
    """Has the run handed its early probe the go-ahead? probe/prestart.py names the file it
    writes (`/<HANDSHAKE_PREFIX><random>`) in the early process's own arguments. Looked for in the
    early process's own root (/proc/PID/root), not through the engine: the run is frozen when
    this is asked, and an archive stream it had open holds the container's lock, so an inspect
    or a `docker cp` of that container would wait for a run that cannot go on."""
    pids = early_processes(container_ids)
    assert pids, "no early process to ask"
    for pid in pids:
        args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        paths = [a.decode() for a in args if a.startswith(b"/" + HANDSHAKE_PREFIX.encode())]
        assert paths, "the early process names no go-ahead file"
        if any(os.path.lexists(f"/proc/{pid}/root{path}") for path in paths):
            return True
    return False


def _default_signals() -> None:
    # A suite started as a background job of a non-interactive shell hands its children SIGINT
    # ignored, and a Python started so keeps ignoring it (as it should). The user this test
    # stands for presses Ctrl-C at a terminal: the child gets the default disposition.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_run_stopped_while_the_early_probe_waits_leaves_nothing(sig, code, client, tag, tmp_path):
    proc = subprocess.Popen([str(SCRIPT), "apply", "--image", fixture_image(), "--tag", tag,
                             "--report-dir", str(tmp_path / "r")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=_default_signals)
    try:
        seen, early = _watch(proc, client, until_early=True)
        assert early, "the run never started its probe early"
        # Frozen, the tool cannot hand over the go-ahead; that it has not yet is checked, not assumed.
        proc.send_signal(signal.SIGSTOP)
        assert early_processes(seen)
        assert not _go_ahead_written(seen), "the go-ahead was written before the signal"
        proc.send_signal(sig)
        proc.send_signal(signal.SIGCONT)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert proc.returncode == code, stderr[-2000:]
    if sig == signal.SIGINT:
        assert "dspark-patch: interrupted; nothing was committed" in stderr
    _nothing_left(client, seen, tag, proc.pid)


def test_a_compile_failure_with_the_early_probe_waiting_leaves_nothing(client, tag, tmp_path):
    # The patch set with one added line that is not Python: it places at zero fuzz, writes,
    # and fails to compile, so the early probe never gets its go-ahead.
    broken = tmp_path / "broken" / PATCH_SET.name  # a patch set folder is named by its id
    broken.parent.mkdir()
    subprocess.run(["cp", "-r", str(PATCH_SET), str(broken)], check=True)
    diff = broken / "vllm-0.33.0.patch"
    text = diff.read_text()
    good = "+    VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER: bool = False\n"
    assert text.count(good) == 1
    diff.write_text(text.replace(good, "+    VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER: bool = (\n"))
    # Its reviewed hashes say so (a post-image is always enforced on the reviewed pre-images):
    # envs.py's post-image is the image's file with that one entry of the diff, applied by GNU patch.
    _review_envs_post(client, broken, tmp_path / "oracle")
    proc = subprocess.Popen([str(SCRIPT), "apply", "--image", fixture_image(), "--patch", str(broken),
                             "--tag", tag, "--report-dir", str(tmp_path / "r")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        seen, early = _watch(proc, client, until_early=False)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, proc.stderr.read().decode()
    assert early, "the run never started its probe early"
    _nothing_left(client, seen, tag, proc.pid)
    audit = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert audit["status"] == "failed" and not audit["compile"]["ok"]
    assert audit["probe"]["ran"] is False
    assert "probe" not in [s["name"] for s in audit["steps"]]
