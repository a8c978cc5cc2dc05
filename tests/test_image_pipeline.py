"""`apply --image` / `verify --image` / `probe --image` end to end, through the console script,
on a real Docker engine and the fixture image built from the real vLLM 0.33.0 wheel.

These run by default: a missing engine or image fails them (tests/support/images.py), never skips.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import tarfile
import uuid

import docker
import jsonschema
import pytest

from dspark_patch.patchset import resolve
from dspark_patch.pipeline import LABEL_PREFIX
from dspark_patch.report.audit_json import load_schema
from dspark_patch.targets.docker import CONFIG_FIELDS, DockerEngine
from tests.support.cli import SCRIPT, Result, run
from tests.support.containers import left_by, on_host, our_containers, signalled_when
from tests.support.images import fixture_image, no_python_image, no_vllm_image

pytestmark = pytest.mark.engine

VARIANT = resolve("dspark-skip-mtp-buffer").variant_for("0.33.0")
LOCATION = "/usr/local/lib/python3.11/dist-packages"
MODEL = "vllm/models/deepseek_v4/nvidia/model.py"


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    return docker.from_env()


@pytest.fixture(scope="module")
def source(client) -> str:
    return fixture_image()


@pytest.fixture
def tag(client):
    """A fresh tag name; the image it names is removed after the test."""
    name = f"dspark-patch/test-result:{uuid.uuid4().hex[:10]}"
    yield name
    try:
        client.images.remove(name, force=True)
    except docker.errors.ImageNotFound:
        pass


    return False


def image_exists(client, ref: str) -> bool:
    try:
        client.images.get(ref)
        return True
    except docker.errors.ImageNotFound:
        return False


@pytest.fixture(scope="module")
def applied(client, source, tmp_path_factory):
    """One real `apply --image` run, shared by the checks on its result."""
    out = tmp_path_factory.mktemp("applied")
    tag = f"dspark-patch/test-result:applied-{uuid.uuid4().hex[:8]}"
    before = client.images.get(source).attrs
    res = run("apply", "--image", source, "--tag", tag, "--report-dir", str(out / "report"))
    yield res, tag, before, out
    client.images.remove(tag, force=True)


def test_apply_image_reports_applied_and_names_the_result(applied, source):
    res, tag, before, out = applied
    assert res.returncode == 0, res.stderr
    audit = json.loads((out / "report" / "audit.json").read_text())
    jsonschema.validate(audit, load_schema())
    assert audit["status"] == "applied"
    assert audit["target"]["image"] == {"ref": source, "id": before["Id"], "repo_digest": None}
    assert audit["result_image"]["ref"] == tag
    assert audit["target"]["distribution"] == {"name": "vllm", "version": "0.33.0", "location": LOCATION}
    assert [f["post_sha256"] for f in audit["files"]] == [VARIANT.files[f["path"]].post_sha256 for f in audit["files"]]
    assert audit["probe"]["ok"] and audit["compile"]["ok"]
    assert str(out / "report" / "audit.json") in res.stderr  # says where the report is


def test_result_keeps_the_source_config_field_by_field_with_one_new_layer(applied, client):
    res, tag, before, _ = applied
    after = client.images.get(tag).attrs
    for field in CONFIG_FIELDS:
        if field == "Labels":
            continue
        assert after["Config"].get(field) == before["Config"].get(field), field
    ours = {k: v for k, v in after["Config"]["Labels"].items() if k.startswith(LABEL_PREFIX)}
    theirs = {k: v for k, v in after["Config"]["Labels"].items() if not k.startswith(LABEL_PREFIX)}
    assert theirs == before["Config"]["Labels"]
    assert after["RootFS"]["Layers"][:-1] == before["RootFS"]["Layers"]
    assert len(after["RootFS"]["Layers"]) == len(before["RootFS"]["Layers"]) + 1
    assert ours[f"{LABEL_PREFIX}.patch.id"] == "dspark-skip-mtp-buffer"
    assert ours[f"{LABEL_PREFIX}.patch.variant"] == "vllm-0.33.0"
    assert json.loads(ours[f"{LABEL_PREFIX}.files"]) == {p: h.post_sha256 for p, h in VARIANT.files.items()}


def test_the_source_image_is_untouched(applied, client, source):
    _, _, before, _ = applied
    assert client.images.get(source).attrs["Id"] == before["Id"]
    assert client.images.get(source).attrs["RootFS"] == before["RootFS"]


def test_the_new_layer_holds_exactly_the_patched_files_and_their_bytecode(applied, client):
    res, tag, _, _ = applied
    image = client.images.get(tag)
    layer_files = _top_layer_files(image)
    expected = set()
    for rel in VARIANT.files:
        folder, _, name = rel.rpartition("/")
        expected.add(f"{LOCATION}/{rel}")
        expected.add(f"{LOCATION}/{folder}/__pycache__/{name[:-3]}.cpython-311.pyc")
    assert {p for p, kind in layer_files.items() if kind == "file"} == {p.lstrip("/") for p in expected}


def _top_layer_files(image) -> dict[str, str]:
    """path -> 'file'/'dir' of the last layer of a `docker save` of the image."""
    raw = b"".join(image.save())
    with tarfile.open(fileobj=io.BytesIO(raw)) as outer:
        manifest = json.load(outer.extractfile("manifest.json"))
        top = manifest[0]["Layers"][-1]
        with tarfile.open(fileobj=outer.extractfile(top)) as layer:
            return {m.name: ("dir" if m.isdir() else "file") for m in layer.getmembers()}


def test_no_container_is_left_behind(applied, client):
    assert left_by(client, applied[0]) == []


def test_a_kept_container_is_found_as_left_by_its_run(client, tag, tmp_path):
    # The oracle the tests above use finds what a run leaves: a kept container is named for it.
    res = run("apply", "--image", no_vllm_image(), "--pull", "never", "--tag", tag, "--report-dir", str(tmp_path / "r"),
              env={"DSPARK_PATCH_KEEP_CONTAINER": "1"})
    res.assert_clean_error(2)
    left = left_by(client, res)
    try:
        assert len(left) == 1 and left[0].startswith("dspark-patch--target-kept--"), left
    finally:
        for name in left:
            client.containers.get(name).remove(force=True, v=True)


def test_verify_passes_on_the_result_and_fails_on_the_source(applied, source, tmp_path):
    res, tag, _, _ = applied
    ok = run("verify", "--image", tag, "--json", "--report-dir", str(tmp_path / "v1"))
    assert ok.returncode == 0, ok.stderr
    assert ok.json["status"] == "verified" and ok.json["probe"]["ok"]
    assert ok.json["integrity"]["checked"] > 5000
    jsonschema.validate(ok.json, load_schema())
    bad = run("verify", "--image", source, "--report-dir", str(tmp_path / "v2"))
    line = bad.assert_clean_error(1)
    assert "vllm/envs.py is unpatched" in line


def test_probe_command_on_images(applied, source, tmp_path):
    _, tag, _, _ = applied
    assert run("probe", "--image", tag, "--report-dir", str(tmp_path / "p1")).returncode == 0
    assert run("probe", "--image", source, "--report-dir", str(tmp_path / "p2")).returncode == 1


def test_applying_to_the_patched_image_says_already_applied_and_tags_it(applied, client, tag, tmp_path):
    _, patched, _, _ = applied
    res = run("apply", "--image", patched, "--tag", tag, "--json", "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    assert res.json["status"] == "already-applied"
    assert client.images.get(tag).id == client.images.get(patched).id  # no new layer, same image


def test_verify_names_labels_that_disagree_with_the_files(applied, client, tag, tmp_path):
    _, patched, _, _ = applied
    relabelled = _commit_changed(client, patched, tag, labels={f"{LABEL_PREFIX}.patch.sha256": "0" * 64})
    res = run("verify", "--image", relabelled, "--no-probe", "--report-dir", str(tmp_path / "r"))
    assert "label" in res.assert_clean_error(1)


def _image_ids(client) -> set[str]:
    # The low-level list: the high-level one inspects each image, and another run's image can
    # vanish in between.
    return set(client.api.images(all=True, quiet=True))


DRY_RUN_LABEL = "test.dry-run"


def _made_from(client, before: set[str], mark: str, source_id: str) -> list[str]:
    """Images new since `before` that carry the source's label `mark` (a config kept from it):
    what a run on the source left. (scripts/test runs another session on this engine: its images
    come and go meanwhile, none with this label.)"""
    found = []
    for image_id in _image_ids(client) - before:
        try:
            attrs = client.api.inspect_image(image_id)
        except docker.errors.NotFound:
            continue
        if image_id != source_id and ((attrs.get("Config") or {}).get("Labels") or {}).get(DRY_RUN_LABEL) == mark:
            found.append(image_id)
    return found


def test_dry_run_commits_nothing(client, source, tag, tmp_path):
    # The fixture under a label of its own (no new layer), so that what the run would make of it
    # is told apart from the images of the session beside this one.
    mark = uuid.uuid4().hex
    own = f"dspark-patch/test-dry-run:{mark[:10]}"
    image, _ = client.images.build(fileobj=io.BytesIO(f"FROM {source}\nLABEL {DRY_RUN_LABEL}={mark}\n".encode()),
                                   tag=own, rm=True, network_mode="none")
    try:
        images_before = _image_ids(client)
        res = run("apply", "--image", own, "--tag", tag, "--dry-run", "--json", "--report-dir", str(tmp_path / "r"))
        assert res.returncode == 0, res.stderr
        assert res.json["status"] == "dry-run" and res.json["result_image"] is None
        assert not image_exists(client, tag)
        assert _made_from(client, images_before, mark, image.id) == []
        assert left_by(client, res) == []
    finally:
        client.images.remove(own, force=True)


def test_drifted_file_in_the_image_is_refused_and_nothing_tagged(client, source, tag, tmp_path):
    drifted_tag = f"{tag}-drifted"
    try:
        drifted = _commit_changed(client, source, drifted_tag, files={
            f"{LOCATION}/{MODEL}": lambda b: b.replace(b"needs_mtp_hidden_states", b"needs_mtp_hidden_state5", 1)})
        res = run("apply", "--image", drifted, "--tag", tag, "--report-dir", str(tmp_path / "r"))
        line = res.assert_clean_error(1)
        assert MODEL in line and "pre-image" in line
        assert not image_exists(client, tag)
        assert left_by(client, res) == []
        audit = json.loads((tmp_path / "r" / "audit.json").read_text())
        assert audit["status"] == "failed" and audit["result_image"] is None
    finally:
        client.images.remove(drifted_tag, force=True)


@pytest.mark.parametrize(
    ("image", "code", "words"),
    [
        (no_python_image, 2, "has no python3 or python"),
        (no_vllm_image, 2, "no vllm installed in image"),
        # A loopback registry name and --pull never: no test may make the engine reach a public registry.
        (lambda: "127.0.0.1:9/dspark-patch/does-not-exist:1", 2, "not found on the engine"),
    ],
)
def test_refusals_are_one_line_and_leave_nothing(image, code, words, client, tag, tmp_path):
    res = run("apply", "--image", image(), "--pull", "never", "--tag", tag, "--report-dir", str(tmp_path / "r"))
    assert words in res.assert_clean_error(code)
    assert not image_exists(client, tag)
    assert left_by(client, res) == []
    assert json.loads((tmp_path / "r" / "audit.json").read_text())["status"] == "failed"


def test_unreachable_engine_is_exit_3_naming_docker_host(tmp_path):
    res = run("apply", "--image", "anything:1", "--report-dir", str(tmp_path / "r"),
              env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert "DOCKER_HOST" in res.assert_clean_error(3)


def test_existing_tag_is_refused_before_any_work(client, source, tag, tmp_path):
    client.images.get(source).tag(tag)
    res = run("apply", "--image", source, "--tag", tag, "--report-dir", str(tmp_path / "r"))
    assert "already exists" in res.assert_clean_error(2)
    assert client.images.get(tag).id == client.images.get(source).id
    assert left_by(client, res) == []


def _running(client, names: list[str]) -> bool:
    for name in names:
        try:
            if client.containers.get(name).status == "running":
                return True
        except docker.errors.NotFound:
            continue
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_run_killed_midway_leaves_no_tag_and_its_container_goes(sig, client, source, tag, tmp_path):
    host = f"dspark-test-{uuid.uuid4().hex[:12]}"
    pid, code, said = signalled_when(on_host(host, [str(SCRIPT), "apply", "--image", source, "--tag", tag,
                                                    "--report-dir", str(tmp_path / "r")]),
                                     # midway: this run's own container (its host name) is running
                                     lambda: _running(client, [n for n in our_containers(client)
                                                                if f"--{host}--" in n]), sig)
    try:
        assert code != 0
        assert not image_exists(client, tag)
        # This run's containers carry its host name: other tests' (another session on the engine,
        # or an xdist worker) are not this test's to count.
        def its_own() -> list[str]:
            return [n for n in our_containers(client) if f"--{host}--" in n]

        if sig == signal.SIGTERM:
            assert its_own() == [], said  # cleaned up on the way out
        else:
            left = its_own()
            assert left and all(f"--{host}--{pid}--" in name for name in left)  # SIGKILL: nothing could clean up ...
            done = subprocess.run(on_host(host, [str(SCRIPT), "apply", "--image", source, "--dry-run", "--json",
                                                  "--report-dir", str(tmp_path / "next")]),
                                  capture_output=True, text=True, timeout=900)
            res = Result(done.returncode, done.stdout, done.stderr)
            assert res.returncode == 0, res.stderr
            assert its_own() == []  # ... so the next run on its host removed it
            assert any("left by an earlier" in n for n in res.json["notes"])
    finally:  # a failed check above must not leave a container that no run on this host removes
        engine = DockerEngine(client)
        for container_id, name in engine.our_containers():
            if f"--{host}--" in name:
                engine.remove_container(container_id)


def _commit_changed(client, ref: str, new_tag: str, *, files=None, labels=None) -> str:
    """A test image: `ref` with some files rewritten and/or labels changed (via the SDK directly)."""
    image = client.images.get(ref)
    container = client.containers.create(image.id, entrypoint=["/bin/true"], network_disabled=True)
    try:
        for path, change in (files or {}).items():
            stream, _ = container.get_archive(path)
            with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
                member = tar.getmembers()[0]
                data = change(tar.extractfile(member).read())
            buf = io.BytesIO()
            with tarfile.open(fileobj=buf, mode="w") as tar:
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
            container.put_archive(os.path.dirname(path), buf.getvalue())
        config = dict(image.attrs["Config"])
        config["Labels"] = {**(config.get("Labels") or {}), **(labels or {})}
        committed = client.images.get(container.commit(conf=config).id)
        committed.tag(new_tag)
    finally:
        container.remove(force=True)
    return new_tag


def test_an_image_whose_consumer_reads_the_residual_fails_the_probe_and_is_not_tagged(client, source, tag, tmp_path):
    dflash = f"{LOCATION}/vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"
    anchor = b"        start = 0\n        if num_graph_tokens and self._aux_staging is not None:\n"
    broken_tag = f"{tag}-broken-consumer"
    try:
        broken = _commit_changed(client, source, broken_tag, files={
            dflash: lambda b: b.replace(anchor, b"        _ = last_hidden_states[:num_tokens].sum()\n" + anchor, 1)})
        # --allow-unknown-base: the edited consumer is not the published wheel, which apply refuses
        # before writing; here the probe has to be the one that says no
        res = run("apply", "--image", broken, "--tag", tag, "--allow-unknown-base", "--report-dir", str(tmp_path / "r"))
        line = res.assert_clean_error(1)
        assert "probe" in line and "consumer: an eager step combines the aux states, never reads the residual" in line
        assert not image_exists(client, tag)
        # nothing committed on top of it (other sessions' images may come and go meanwhile)
        broken_id = client.images.get(broken).id
        assert [i["Id"] for i in client.api.images(all=True) if i.get("ParentId") == broken_id] == []
        assert left_by(client, res) == []  # the work container and its twin are gone
    finally:
        client.images.remove(broken_tag, force=True)


def test_a_patch_that_deletes_a_module_removes_it_from_the_image(client, source, tag, tmp_path):
    """Deleting is a whiteout in the new layer: the file (and its bytecode) are gone from the
    result, the source still has them, and verify proves the result carries the diff."""
    gone = "vllm/logging_utils/__init__.py"
    pre = client.containers.run(source, ["-c", f"import sys; sys.stdout.write(open('{LOCATION}/{gone}').read())"],
                                entrypoint="python3", network_mode="none", remove=True)
    lines = pre.decode().splitlines(keepends=True)
    diff = tmp_path / "delete.diff"
    diff.write_text(f"--- a/{gone}\n+++ /dev/null\n@@ -1,{len(lines)} +0,0 @@\n" + "".join("-" + line for line in lines))
    res = run("apply", "--image", source, "--tag", tag, "--pull", "never", "--patch", str(diff), "--json",
              "--report-dir", str(tmp_path / "r"))
    assert res.returncode == 0, res.stderr
    changes = {c["path"]: c["kind"] for c in res.json["layer"]["changes"]}
    assert changes[f"{LOCATION}/{gone}"] == "D"
    assert changes[f"{LOCATION}/vllm/logging_utils/__pycache__/__init__.cpython-311.pyc"] == "D"
    top = _top_layer_files(client.images.get(tag))
    assert {p for p, kind in top.items() if kind == "file"} == {
        f"{LOCATION}/vllm/logging_utils/.wh.__init__.py".lstrip("/"),
        f"{LOCATION}/vllm/logging_utils/__pycache__/.wh.__init__.cpython-311.pyc".lstrip("/"),
    }
    probe = f"import os; print(os.path.exists('{LOCATION}/{gone}'), os.path.exists('{LOCATION}/vllm/envs.py'))"
    assert client.containers.run(tag, ["-c", probe], entrypoint="python3", network_mode="none", remove=True) == b"False True\n"
    assert client.containers.run(source, ["-c", probe], entrypoint="python3", network_mode="none", remove=True) == b"True True\n"
    res = run("verify", "--image", tag, "--pull", "never", "--patch", str(diff), "--json", "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 0, res.stderr
