"""ImageTarget and DockerEngine against a real engine and the real fixture images.

The fixture image holds the real vLLM 0.33.0 wheel and CPU torch, built offline by
scripts/build-images. Without an engine these tests fail (they are never skipped).
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
import textwrap
import time
import uuid
import zipfile

import docker
import pytest

from dspark_patch.errors import EngineUnreachable, TagRace, TargetNotFound
from dspark_patch.patching.plan import FilePlan, PatchPlan
from dspark_patch.targets.docker import NAME_PREFIX, DockerEngine, ImageTarget, gc_containers, result_image
from dspark_patch.targets.docker.naming import Owner
from tests.support import images, vllm

pytestmark = pytest.mark.engine

SITE = "/usr/local/lib/python3.11/dist-packages"
ENVS = "vllm/envs.py"
CONFIG_FIELDS_WE_KEEP = (
    "Entrypoint", "Cmd", "User", "WorkingDir", "Env", "ExposedPorts", "Volumes",
    "StopSignal", "Healthcheck", "Shell", "OnBuild",
)


@pytest.fixture(scope="module")
def engine() -> DockerEngine:
    return DockerEngine()


@pytest.fixture(scope="module")
def fixture_ref() -> str:
    return images.fixture_image()


def _ours(engine: DockerEngine) -> set[str]:
    return {name for _, name in engine.our_containers()}


def _mine(engine: DockerEngine) -> set[str]:
    """Containers of ours made by this test process (other runs may share the engine)."""
    return {name for name in _ours(engine) if f"--{os.getpid()}--" in name}


def _images_marked(engine: DockerEngine, mark: dict[str, str]) -> list[str]:
    [(key, value)] = mark.items()
    return [i.id for i in engine.client.images.list(all=True, filters={"label": f"{key}={value}"})]


def _plan(*files: FilePlan) -> PatchPlan:
    return PatchPlan(status="apply", diff_sha256="0" * 64, files=files)


def _modify(path: str, pre: bytes, post: bytes) -> FilePlan:
    return FilePlan(path=path, action="modify", pre=pre, post=post,
                    pre_sha256=hashlib.sha256(pre).hexdigest(),
                    post_sha256=hashlib.sha256(post).hexdigest(), placements=())


def _stat(target: ImageTarget, path: str) -> tuple[int, int, int]:
    result = target.run_python(
        "import os, sys\ns = os.stat(sys.argv[1])\nprint(s.st_mode & 0o7777, s.st_uid, s.st_gid)",
        [path],
    )
    assert result.returncode == 0, result.stderr
    mode, uid, gid = map(int, result.stdout.split())
    return mode, uid, gid


def _wheel_file(path: str) -> bytes:
    with zipfile.ZipFile(vllm.wheel("0.33.0")) as wheel:
        return wheel.read(path)


# --- lifecycle -----------------------------------------------------------------------------
def test_container_exists_only_inside_the_with_block(engine, fixture_ref):
    with ImageTarget(fixture_ref, engine=engine) as target:
        container = engine.client.containers.get(target.container.id)
        assert container.status == "running"
        assert container.name.startswith(NAME_PREFIX)
        # networking off, and nothing of ours on the config that a commit could pick up
        assert container.attrs["HostConfig"]["NetworkMode"] == "none"
        assert container.attrs["Config"]["Env"] == engine.image_info(fixture_ref).config["Env"]
        assert container.attrs["Config"]["Labels"] == engine.image_info(fixture_ref).config["Labels"]
        # the image's health check (a urllib request every 30 s, seconds each under emulation)
        # does not run beside the tool's work; the result keeps it (see the commit test)
        assert engine.image_info(fixture_ref).config["Healthcheck"]["Test"][0] == "CMD"
        assert container.attrs["Config"]["Healthcheck"]["Test"] == ["NONE"]
        assert "Health" not in container.attrs["State"]
        name = container.name
    assert name not in _ours(engine)
    assert _mine(engine) == set()


def test_container_removed_when_the_block_raises(engine, fixture_ref):
    with pytest.raises(ZeroDivisionError):
        with ImageTarget(fixture_ref, engine=engine) as target:
            name = target.container.name
            1 / 0
    assert name not in _ours(engine)


def test_keep_env_keeps_the_container_and_says_so(engine, fixture_ref):
    # A separate run with the variable set, as a user debugging would start it.
    script = textwrap.dedent(f"""
        from dspark_patch.targets.docker import ImageTarget
        with ImageTarget({fixture_ref!r}) as target:
            name = target.container.name
        print(name)
        print(*target.notes, sep="\\n")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          env={**os.environ, "DSPARK_PATCH_KEEP_CONTAINER": "1"})
    name, *notes = done.stdout.splitlines()
    try:
        assert name in _ours(engine)
        assert any("kept container" in note for note in notes)
        # a later run's automatic clean-up leaves a kept container alone; `gc` removes it
        with ImageTarget(fixture_ref, engine=engine):
            assert name in _ours(engine)
        assert name in gc_containers(engine)
        assert name not in _ours(engine)
    finally:
        try:
            engine.client.containers.get(name).remove(force=True, v=True)
        except docker.errors.NotFound:
            pass


def test_sigterm_removes_the_container(engine, fixture_ref):
    script = textwrap.dedent(f"""
        import sys, time
        from dspark_patch.targets.docker import ImageTarget
        with ImageTarget({fixture_ref!r}) as target:
            print(target.container.name, flush=True)
            time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    name = proc.stdout.readline().strip()
    assert name in _ours(engine)
    proc.terminate()
    assert proc.wait(timeout=60) == 128 + 15
    assert name not in _ours(engine)


def test_gc_removes_a_killed_runs_container_and_keeps_live_ones(engine, fixture_ref):
    host = _ours_host()
    dead = f"{NAME_PREFIX}target--{host}--999999999--12345--dead01"
    live = f"{NAME_PREFIX}target--{host}--{os.getpid()}--{_my_start()}--live01"
    for name in (dead, live):
        engine.client.containers.create(fixture_ref, name=name, entrypoint=["true"], network_mode="none")
    try:
        assert dead in engine.gc_containers()
        assert dead not in _ours(engine) and live in _ours(engine)
        # the next run collects leftovers by itself
        engine.client.containers.create(fixture_ref, name=dead, entrypoint=["true"], network_mode="none")
        with ImageTarget(fixture_ref, engine=engine) as target:
            assert dead not in _ours(engine)
            assert any("earlier, killed run" in note for note in target.notes)
    finally:
        for name in (dead, live):
            try:
                engine.client.containers.get(name).remove(force=True, v=True)
            except docker.errors.NotFound:
                pass


def _ours_host() -> str:
    import socket

    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in socket.gethostname())


def _my_start() -> str:
    with open(f"/proc/{os.getpid()}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[19]


def test_a_zombie_owner_counts_as_gone_and_its_container_is_collected(engine, fixture_ref):
    """A killed run whose process is not yet reaped will never remove its container."""
    host = _ours_host()
    child = os.fork()
    if child == 0:
        os._exit(0)
    try:
        for _ in range(200):  # wait until it has exited (state Z), without reaping it
            with open(f"/proc/{child}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                break
            time.sleep(0.05)
        assert fields[0] == "Z"
        name = f"{NAME_PREFIX}target--{host}--{child}--{fields[19]}--zomb01"
        assert not Owner.parse(name).alive()
        engine.client.containers.create(fixture_ref, name=name, entrypoint=["true"], network_mode="none")
        try:
            assert name in engine.gc_containers()
        finally:
            try:
                engine.client.containers.get(name).remove(force=True, v=True)
            except docker.errors.NotFound:
                pass
    finally:
        os.waitpid(child, 0)


# --- locate, read, run_python ----------------------------------------------------------------
def test_locate_finds_the_real_vllm_and_python(engine, fixture_ref):
    with ImageTarget(fixture_ref, engine=engine) as target:
        dist = target.locate("vllm")
    assert (dist.name, dist.version) == ("vllm", "0.33.0")
    assert dist.location == SITE
    assert dist.python_version.startswith("3.11.")
    assert dist.python == "/usr/bin/python3"
    assert dist.cache_tag == "cpython-311"
    assert dist.record_file == "vllm-0.33.0.dist-info/RECORD"
    envs = {e.path: e for e in dist.record}[ENVS]
    assert envs.sha256 == hashlib.sha256(_wheel_file(ENVS)).hexdigest()


def test_read_returns_the_files_bytes_and_none_when_missing(engine, fixture_ref):
    with ImageTarget(fixture_ref, engine=engine) as target:
        target.locate("vllm")
        assert target.read(ENVS) == _wheel_file(ENVS)
        assert target.read("vllm/no_such_module.py") is None


def test_run_python_env_is_per_exec_and_output_is_split(engine, fixture_ref):
    with ImageTarget(fixture_ref, engine=engine) as target:
        target.locate("vllm")
        source = "import os, sys\nprint(os.environ.get('PROBE_X'))\nprint('err', file=sys.stderr)\nsys.exit(4)"
        first = target.run_python(source, env={"PROBE_X": "1"})
        second = target.run_python(source)
        container_env = engine.client.containers.get(target.container.id).attrs["Config"]["Env"]
    assert (first.returncode, first.stdout, first.stderr) == (4, b"1\n", b"err\n")
    assert second.stdout == b"None\n"
    assert not any(e.startswith("PROBE_X") for e in container_env)


def test_run_python_stops_at_the_timeout(engine, fixture_ref):
    with ImageTarget(fixture_ref, engine=engine) as target:
        result = target.run_python("import time\ntime.sleep(60)", timeout=2)
    assert result.timed_out
    assert result.returncode != 0


def test_importing_torch_in_the_image_works(engine, fixture_ref):
    # The probe runs torch with the image's python; the fixture must really have it.
    with ImageTarget(fixture_ref, engine=engine) as target:
        result = target.run_python("import torch\nprint(torch.__version__, torch.ones(2).sum().item())",
                                   env={"CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().split() == ["2.13.0+cpu", "2.0"]


# --- write, restore, changes ------------------------------------------------------------------
def test_write_changes_exactly_the_file_and_keeps_owner_and_mode(engine, fixture_ref):
    with ImageTarget(fixture_ref, engine=engine) as target:
        target.locate("vllm")
        path = f"{SITE}/{ENVS}"
        # give the file an owner and mode of its own, so keeping them is visible
        prep = target.run_python("import os, sys\nos.chown(sys.argv[1], 1000, 1000)\nos.chmod(sys.argv[1], 0o640)", [path])
        assert prep.returncode == 0
        pre = target.read(ENVS)
        post = pre + b"\n# patched by a test\n"
        target.write(_plan(_modify(ENVS, pre, post)))
        assert target.read(ENVS) == post
        assert _stat(target, path) == (0o640, 1000, 1000)
        layer = target.take_layer([ENVS]).entries
        target.restore(_plan(_modify(ENVS, pre, post)))
        assert target.read(ENVS) == pre
        assert _stat(target, path) == (0o640, 1000, 1000)
    # the layer is the file and the folders above it, nothing else
    assert [e.path for e in layer if not e.folder] == [path]
    assert [e.sha256 for e in layer if not e.folder] == [hashlib.sha256(post).hexdigest()]
    assert [e.path for e in layer if e.folder] == ["/" + "/".join(path.split("/")[1:i]) for i in range(2, path.count("/") + 1)]


def test_write_is_all_or_nothing(engine, fixture_ref):
    with ImageTarget(fixture_ref, engine=engine) as target:
        target.locate("vllm")
        pre = target.read(ENVS)
        # the second file cannot be written: its folder would be a regular file
        bad = FilePlan(path=f"{ENVS}/impossible.py", action="add", pre=None, post=b"x = 1\n",
                       pre_sha256=None, post_sha256=hashlib.sha256(b"x = 1\n").hexdigest(), placements=())
        with pytest.raises(Exception):
            target.write(_plan(_modify(ENVS, pre, pre + b"# half\n"), bad))
        assert target.read(ENVS) == pre


def test_added_and_deleted_files(engine, fixture_ref):
    with ImageTarget(fixture_ref, engine=engine) as target:
        target.locate("vllm")
        gone = target.read("vllm/py.typed")
        add = FilePlan(path="vllm/dspark_new/helper.py", action="add", pre=None, post=b"X = 1\n",
                       pre_sha256=None, post_sha256=None, placements=())
        delete = FilePlan(path="vllm/py.typed", action="delete", pre=gone, post=None,
                          pre_sha256=None, post_sha256=None, placements=())
        target.write(_plan(add, delete))
        assert target.read("vllm/dspark_new/helper.py") == b"X = 1\n"
        assert target.read("vllm/py.typed") is None
        target.restore(_plan(add, delete))
        assert target.read("vllm/dspark_new/helper.py") is None
        assert target.read("vllm/py.typed") == gone


# --- commit ---------------------------------------------------------------------------------
def test_commit_keeps_the_config_adds_one_layer_and_labels(engine, fixture_ref):
    source = engine.image_info(fixture_ref)
    tag = "dspark-patch/test-commit:result"
    engine.remove_image(tag, force=True)
    try:
        with ImageTarget(fixture_ref, engine=engine) as target:
            target.locate("vllm")
            pre = target.read(ENVS)
            target.write(_plan(_modify(ENVS, pre, pre + b"# patched\n")))
            target.take_layer([ENVS])
            result = target.commit(labels={"io.github.dspark-patch.patch": "test"})
            assert not engine.tag_exists(tag)  # committed untagged: a name is given last
            assert target.name(tag, force=False).id == result.id
        committed = engine.image_info(tag)
        assert committed.id == result.id
        assert committed.layers == source.layers + 1
        for field in CONFIG_FIELDS_WE_KEEP:
            assert committed.config.get(field) == source.config.get(field), field
        assert committed.config["Cmd"] == ["--host", "0.0.0.0", "--port", "8000"]
        assert committed.config["User"] == "vllm"
        assert committed.config["Labels"] == {**source.config["Labels"], "io.github.dspark-patch.patch": "test"}
        # the source image is untouched: same id behind its ref, same config
        assert engine.image_info(fixture_ref).id == source.id
        assert engine.image_info(fixture_ref).config == source.config
        # and the result really holds the patched file
        out = engine.client.containers.run(tag, entrypoint=["tail", "-n", "1", f"{SITE}/{ENVS}"],
                                           remove=True, network_mode="none")
        assert out == b"# patched\n"
    finally:
        engine.remove_image(tag, force=True)


def test_commit_keeps_a_null_entrypoint_null(engine):
    # An image with CMD and no ENTRYPOINT: nothing of ours may become its entrypoint.
    ref = images.no_vllm_image()
    source = engine.image_info(ref)
    assert source.config["Entrypoint"] is None
    result = result_image.build_result(engine, source, images.tiny_layer("/srv/x", b"x"), labels={})
    try:
        committed = engine.image_info(result.id)
        assert committed.config["Entrypoint"] is None
        assert committed.config["Cmd"] == source.config["Cmd"] == ["python3"]
        assert committed.config["User"] == source.config["User"]
        assert committed.layers == source.layers + 1
    finally:
        engine.remove_image(result.id, force=True)


def test_existing_tag_is_refused_without_force_and_moved_with_it(engine, fixture_ref):
    tag = "dspark-patch/test-commit:exists"
    engine.tag(engine.image_info(images.no_vllm_image()).id, tag)
    before = engine.image_info(tag).id
    mark = {"io.github.dspark-patch.test-run": uuid.uuid4().hex}
    try:
        with ImageTarget(fixture_ref, engine=engine) as target:
            target.locate("vllm")
            pre = target.read(ENVS)
            target.write(_plan(_modify(ENVS, pre, pre + b"# x\n")))
            target.take_layer([ENVS])
            committed = target.commit(labels=mark)
            with pytest.raises(TagRace) as refused:
                target.name(tag, force=False)
            assert refused.value.exit_code == 2
            assert engine.image_info(tag).id == before
            assert _images_marked(engine, mark) == [committed.id]  # the caller discards it (pipeline)
            moved = target.name(tag, force=True)
        assert engine.image_info(tag).id == moved.id == committed.id != before
        assert _images_marked(engine, mark) == [moved.id]
    finally:
        engine.remove_image(tag, force=True)


def test_an_image_with_neither_entrypoint_nor_cmd_keeps_both_empty(engine):
    # Nothing is run or committed from a container, so there is no command to leak into it.
    bare_tag = "dspark-patch/test-bare:nocmd-" + uuid.uuid4().hex[:8]
    tag = "dspark-patch/test-bare:result-" + uuid.uuid4().hex[:8]
    dockerfile = f"FROM {engine.image_info(images.base_image()).id}\nCMD []\n".encode()
    engine.client.images.build(fileobj=io.BytesIO(dockerfile), tag=bare_tag, network_mode="none",
                              rm=True, forcerm=True)
    try:
        source = engine.image_info(bare_tag)
        assert not source.config["Cmd"]
        committed = result_image.build_result(engine, source, images.tiny_layer("/srv/y", b"y\n"), labels={})
        engine.tag(committed.id, tag)
        result = engine.image_info(tag)
        assert result.id == committed.id
        assert result.config.get("Cmd") == source.config.get("Cmd")
        assert result.config.get("Entrypoint") == source.config.get("Entrypoint")
        out = engine.client.containers.run(tag, entrypoint=["cat", "/srv/y"], remove=True, network_mode="none")
        assert out == b"y\n"
    finally:
        engine.remove_image(tag, force=True)
        engine.remove_image(bare_tag, force=True)


# --- refusals --------------------------------------------------------------------------------
def test_image_without_python_is_refused(engine):
    with pytest.raises(TargetNotFound, match="has no python3 or python") as refused:
        with ImageTarget(images.no_python_image(), engine=engine):
            pass
    assert refused.value.exit_code == 2
    assert _mine(engine) == set()


def test_image_without_vllm_is_refused(engine):
    with ImageTarget(images.no_vllm_image(), engine=engine) as target:
        with pytest.raises(TargetNotFound, match="no vllm installed in image") as refused:
            target.locate("vllm")
    assert "/usr/lib/python3.11" in refused.value.message
    assert refused.value.exit_code == 2


def test_missing_image_is_refused(engine):
    with pytest.raises(TargetNotFound, match="dspark-patch/no-such-image:1") as refused:
        with ImageTarget("dspark-patch/no-such-image:1", engine=engine):
            pass
    assert "docker images" in refused.value.hint


def test_unreachable_engine(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent.sock")
    with pytest.raises(EngineUnreachable, match="unix:///nonexistent.sock") as refused:
        with ImageTarget("anything"):
            pass
    assert refused.value.exit_code == 3
    assert "DOCKER_HOST" in refused.value.hint
