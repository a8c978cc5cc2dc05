"""What an image `apply` names is what the engine holds, on a real engine and the real fixture.

Two runs that ask for one `--tag` at once: exactly one names its image, the other exits 2 naming
the race and leaves no image (the tag is set last, under the engine's lock on the tag, and only
while it is free). A report folder that cannot take the report set: a non-zero exit and no tag.
"""

from __future__ import annotations

import errno
import io
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import docker
import pytest

from dspark_patch.cli import common
from dspark_patch.errors import EnvironmentProblem, TagRace
from dspark_patch.report.model import AuditReport, ImageRecord, TargetReport
from dspark_patch.targets.docker import DockerEngine, result_image
from dspark_patch.targets.docker.naming import NAME_PREFIX, container_name
from dspark_patch.targets.docker.tag_lock import OWNER_LABEL, lock_name, name_image
from tests.support.cli import run
from tests.support.images import fixture_image, no_vllm_image, tiny_layer

pytestmark = pytest.mark.engine

RUN_LABEL = "io.github.dspark-patch.test-run"

# The real CLI, with one wait added after the report set is written and before the result is
# named: both runs have then passed every check of the tag, so the engine's lock alone decides.
DRIVER = r"""
import sys, time
from pathlib import Path
import dspark_patch.cli.common as common

barrier, me = Path(sys.argv[1]), sys.argv[2]
written = common.write_reports

def write_then_wait(report, folder, junit):
    written(report, folder, junit)
    if report.exit_code == 0 and report.result_image is not None and not (barrier / me).exists():
        (barrier / me).write_text("here")
        deadline = time.monotonic() + 900
        while len(list(barrier.iterdir())) < 2:
            if time.monotonic() > deadline:
                raise SystemExit("the other run never reached its tag step")
            time.sleep(0.05)

common.write_reports = write_then_wait
sys.argv = ["dspark-patch", *sys.argv[3:]]
from dspark_patch.cli import main
main()
"""


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    return docker.from_env()


@pytest.fixture
def source(client) -> Iterator[str]:
    """The fixture image with a label of this test's own: an image id no other test uses, so
    that every image made from it (a result carries the source's labels) is this test's."""
    run_id = uuid.uuid4().hex
    image, _ = client.images.build(
        fileobj=io.BytesIO(f"FROM {fixture_image()}\nLABEL {RUN_LABEL}={run_id}\n".encode()),
        network_mode="none", rm=True, forcerm=True)
    yield image.id
    for found in client.images.list(filters={"label": f"{RUN_LABEL}={run_id}"}):
        client.images.remove(found.id, force=True)


def made_from(client, source_id: str) -> set[str]:
    """Ids of the images that carry the source's own test label, the source excepted."""
    run_id = client.images.get(source_id).labels[RUN_LABEL]
    return {i.id for i in client.images.list(filters={"label": f"{RUN_LABEL}={run_id}"})} - {source_id}


def our_containers(client) -> list[str]:
    return [c.name for c in client.containers.list(all=True) if c.name.startswith(NAME_PREFIX)
            or c.name.startswith("dspark-patch-tag-lock--")]


def test_two_applies_of_one_tag_at_once_one_names_its_image_the_other_the_race(client, source, tmp_path):
    tag = f"dspark-patch/test-race:{uuid.uuid4().hex[:10]}"
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    runs = []
    for name in ("a", "b"):
        argv = [sys.executable, "-c", DRIVER, str(barrier), name, "apply", "--image", source, "--pull", "never",
                "--tag", tag, "--report-dir", str(tmp_path / name)]
        runs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = {name: (p.wait(timeout=1800), p.stderr.read() if p.stderr else "") for name, p in zip("ab", runs, strict=True)}
    for p in runs:
        for stream in (p.stdout, p.stderr):
            if stream is not None:
                stream.close()
    assert sorted(code for code, _ in done.values()) == [0, 2], done
    winner = next(name for name, (code, _) in done.items() if code == 0)
    loser = "b" if winner == "a" else "a"
    won = json.loads((tmp_path / winner / "audit.json").read_text())
    lost = json.loads((tmp_path / loser / "audit.json").read_text())
    # the tag is the winner's image, and the winner's report says so
    assert won["status"] == "applied" and won["result_image"]["ref"] == tag
    assert client.images.get(tag).id == won["result_image"]["id"]
    # the loser: one line naming the race, a failed report naming no result, and no image left
    stderr = done[loser][1]
    errors = [line for line in stderr.splitlines() if line.startswith("dspark-patch: error:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr
    assert tag in errors[0] and ("another run" in errors[0]), errors[0]
    assert lost["status"] == "failed" and lost["exit_code"] == 2 and lost["result_image"] is None
    assert lost["errors"][0]["kind"] == "tag-race"
    assert made_from(client, source) == {won["result_image"]["id"]}
    assert any("removed the image" in note for note in lost["notes"]), lost["notes"]
    # nothing of either run is left on the engine: no work container, no lock
    left = our_containers(client)
    assert lock_name(tag) not in left
    assert [c for c in left if any(f"--{p.pid}--" in c for p in runs)] == []


def test_a_lock_left_by_a_killed_run_is_taken_over_and_a_live_one_is_a_race(client):
    engine = DockerEngine(client)
    image = engine.image_info(no_vllm_image()).id
    tag = f"dspark-patch/test-lock:{uuid.uuid4().hex[:10]}"
    # The owner a killed run leaves in its lock: this host, a process that has ended.
    dead = subprocess.Popen(["true"])
    dead.wait()
    parts = container_name("tag-lock").split("--")
    parts[3] = str(dead.pid)
    left = "--".join(parts)
    client.api.create_container(image, name=lock_name(tag), entrypoint=["/x"], labels={OWNER_LABEL: left})
    try:
        name_image(engine, image, tag, force=False)
        assert engine.image_info(tag).id == image
        assert lock_name(tag) not in our_containers(client)  # taken over, then released
        # A lock whose owner lives (this very process): the tag is being set by it right now.
        other = f"dspark-patch/test-lock:{uuid.uuid4().hex[:10]}"
        alive = container_name("tag-lock")
        client.api.create_container(image, name=lock_name(other), entrypoint=["/x"], labels={OWNER_LABEL: alive})
        try:
            with pytest.raises(TagRace, match="another run is setting the tag"):
                name_image(engine, image, other, force=False)
            assert not engine.tag_exists(other)
            assert lock_name(other) in our_containers(client)  # another run's lock is never removed
        finally:
            client.api.remove_container(lock_name(other), force=True)
    finally:
        engine.remove_image(tag)


@pytest.fixture
def full_folder(tmp_path) -> Iterator[Path]:
    """A folder on a small tmpfs that is full: nothing more can be written there."""
    folder = tmp_path / "full"
    folder.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(folder)], check=True)
    try:
        (folder / "reports").mkdir()  # a folder takes no blocks on a tmpfs; made while there is room
        fd = os.open(folder / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"\0" * 4096):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=True)


def test_a_report_folder_that_is_full_fails_the_apply_and_names_nothing(client, source, full_folder):
    tag = f"dspark-patch/test-full:{uuid.uuid4().hex[:10]}"
    reports = full_folder / "reports"
    result = run("apply", "--image", source, "--pull", "never", "--tag", tag, "--report-dir", str(reports))
    line = result.assert_clean_error(3)
    assert "cannot write the report" in line and "No space left" in line, line
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(tag)
    assert made_from(client, source) == set()  # the committed image went too
    assert sorted(p.name for p in reports.iterdir()) == []  # no partial report set either


def test_reports_that_fail_after_the_tag_take_the_tag_and_the_image_back(client, full_folder):
    engine = DockerEngine(client)
    base = engine.image_info(no_vllm_image())
    layer = tiny_layer("/srv/withdrawn", b"x")
    made = result_image.build_result(engine, base, layer, labels={RUN_LABEL: uuid.uuid4().hex})
    tag = f"dspark-patch/test-withdraw:{uuid.uuid4().hex[:10]}"
    engine.tag(made.id, tag)
    report = AuditReport(command="apply", status="applied", exit_code=0, tool_version="test",
                         started_at="2026-01-01T00:00:00Z", target=TargetReport(kind="image", ref=base.id),
                         result_image=ImageRecord(ref=tag, id=made.id))
    try:
        with pytest.raises(EnvironmentProblem) as failed:
            common.finish(report, report_dir=full_folder / "reports", as_json=True)
        assert f"the tag {tag} was removed again" in failed.value.message
        assert not engine.tag_exists(tag)
        assert not engine.tag_exists(made.id)
    finally:
        engine.remove_image(made.id, force=True)


def test_gc_removes_a_killed_runs_tag_lock_and_keeps_a_live_one(client):
    from dspark_patch.targets.docker import gc_containers

    engine = DockerEngine(client)
    image = engine.image_info(no_vllm_image()).id
    dead_tag, live_tag = (f"dspark-patch/test-gc-lock:{uuid.uuid4().hex[:10]}" for _ in range(2))
    ended = subprocess.Popen(["true"])
    ended.wait()
    parts = container_name("tag-lock").split("--")
    parts[3] = str(ended.pid)
    client.api.create_container(image, name=lock_name(dead_tag), entrypoint=["/x"], labels={OWNER_LABEL: "--".join(parts)})
    client.api.create_container(image, name=lock_name(live_tag), entrypoint=["/x"],
                                labels={OWNER_LABEL: container_name("tag-lock")})
    try:
        removed = gc_containers(engine)
        assert lock_name(dead_tag) in removed and lock_name(live_tag) not in removed
        assert lock_name(dead_tag) not in our_containers(client) and lock_name(live_tag) in our_containers(client)
    finally:
        for tag in (dead_tag, live_tag):
            try:
                client.api.remove_container(lock_name(tag), force=True)
            except docker.errors.NotFound:
                pass
