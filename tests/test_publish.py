"""`publish`: the layer an in-image job wrote, onto the image it ran in, registry to registry.

The job is a container of the official-shape image (uv, no bytecode, USER 2000) run as root with
the tool mounted read-only (tests/test_in_image.py's `_job`); the source images sit in a loopback
registry behind a login; `publish` runs with DOCKER_HOST pointing at nothing. The published image
is then pulled by the engine and checked by `verify --image`, and set beside what
`apply --image` makes of the same source: the same config (labels included), the same files.

Every bad input (a report or layer from another image or release, edited, a file more or less,
bytecode of another source, a tag that exists) is one line, exit 2, and nothing is pushed: the
registry's log shows no write and the tag is not there.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from dspark_patch.patchset import resolve
from dspark_patch.report.audit_json import read_report
from tests.support.cli import run
from tests.support.images import fixture_image, official_032_image, official_image
from tests.support.registry import login_registry_in, push_only_to_registry
from tests.support.tool_folder import tool_folder
from tests.test_in_image import APPLY, SITE, _job

pytestmark = pytest.mark.engine

USER, PASSWORD = "publisher", "s3cret-for-publish"
NO_ENGINE = "tcp://127.0.0.1:9"
VARIANT = resolve("dspark-skip-mtp-buffer").variant_for("0.33.0")


@pytest.fixture(scope="module")
def login_registry(tmp_path_factory: pytest.TempPathFactory):
    with login_registry_in(tmp_path_factory.mktemp("publish-registry"), USER, PASSWORD) as reg:
        yield reg


@pytest.fixture(scope="module")
def sources(login_registry) -> dict[str, str]:
    """The official-shape 0.33.0 and 0.32.0 images and the pip-made fixture, only in the registry."""
    address, config, _ = login_registry
    refs = {"0.33.0": f"{address}/team/vllm:0.33.0", "0.32.0": f"{address}/team/vllm:0.32.0",
            "pip": f"{address}/team/pip-made:0.33.0"}
    for key, image in (("0.33.0", official_image()), ("0.32.0", official_032_image()), ("pip", fixture_image())):
        push_only_to_registry(image, refs[key], config)
    return refs


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The in-image job's output folder (layer.tar, r/audit.json) for each official release."""
    tool = tool_folder(tmp_path_factory.mktemp("tool") / "dspark-patch")
    found = {}
    for release, image in (("0.33.0", official_image()), ("0.32.0", official_032_image())):
        out = tmp_path_factory.mktemp(f"job-{release}")
        done = _job(tool, out, APPLY, user="0", image=image)
        assert done.returncode == 0, done.stderr[-3000:]
        found[release] = out
    return found


def _env(login_registry, tmp_path: Path) -> dict[str, str]:
    return {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(login_registry.config),
            "DSPARK_PATCH_CACHE": str(tmp_path / "cache")}


def _publish(source: str, layer: Path, report: Path, tag: str, env: dict[str, str], *extra: str):
    return run("publish", "--image", source, "--layer", str(layer), "--report", str(report), "--tag", tag, *extra, env=env)


def _writes(log: Path, since: int) -> list[str]:
    """The writes (POST, PUT, PATCH, DELETE) the registry answered since byte `since` of its log."""
    text = log.read_bytes()[since:].decode("utf-8", "replace")
    return re.findall(r'"(?:POST|PUT|PATCH|DELETE) (/v2/[^ ]+) HTTP/[0-9.]+" 2\d\d ', text)


def _tag_there(address: str, config: Path, ref: str) -> bool:
    done = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--authfile", str(config / "config.json"),
                           f"docker://{ref}"], capture_output=True, text=True, check=False)
    return done.returncode == 0


@pytest.fixture(scope="module")
def published(login_registry, sources: dict[str, str], jobs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory):
    """The 0.33.0 job's layer published with no engine: (DEST, the run, its report folder, the blob
    uploads the registry saw)."""
    address, config, log = login_registry
    work = tmp_path_factory.mktemp("published")
    dest = f"{address}/team/served:0.33.0-dspark"
    out = jobs["0.33.0"]
    start = log.stat().st_size
    done = _publish(sources["0.33.0"], out / "layer.tar", out / "r/audit.json", dest, _env(login_registry, work),
                    "--report-dir", str(work / "published"), "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    uploads = [w for w in _writes(log, start) if "/blobs/uploads/" in w and "digest=" in w]
    return dest, done, work / "published", uploads


def test_a_layer_made_in_image_and_published_with_no_engine_is_what_apply_image_makes(
        login_registry, published, jobs: dict[str, Path], tmp_path: Path) -> None:
    address, config, log = login_registry
    env = _env(login_registry, tmp_path)
    dest, done, folder, uploads = published
    out = jobs["0.33.0"]
    said = done.json
    layer_size = (out / "layer.tar").stat().st_size
    # Only the new layer's blob and the config were sent; the five base layers were mounted from
    # team/vllm, never uploaded again.
    assert said["sent"]["uploaded"] == 2 and said["sent"]["mounted"] == 5 and said["sent"]["copied_bytes"] == 0
    assert said["sent"]["bytes"] < layer_size
    assert len(uploads) == 2
    assert said["bytecode_checked"] == len(VARIANT.files) == said["bytecode_recompiled"]
    read_report(folder / "audit.json")   # the published report is a valid audit report (its schema)
    report = json.loads((folder / "audit.json").read_text())
    assert report["target"]["kind"] == "image" and report["result_image"]["repo_digest"] == said["repo_digest"]
    # the job judged the files inside the image (its own report: a folder); the published one says so
    assert json.loads((out / "r/audit.json").read_text())["route"]["name"] == "local"
    assert report["route"]["name"] == "in-image" and report["route"]["reason"].startswith("publish: the in-image job's run")
    assert report["target"]["image"]["id"] == json.loads(
        subprocess.run(["docker", "image", "inspect", official_image()], capture_output=True, text=True,
                       check=True).stdout)[0]["Id"]

    # status reads it straight from the registry: applied, clean.
    status = run("status", "--via", "registry", "--image", dest, "--json", env=env)
    row = status.json["images"][0]
    assert status.returncode == 0 and dict(row["patch_sets"])["dspark-skip-mtp-buffer"] == "applied", status.stdout

    # With an engine: pulled, verified, and beside `apply --image` of the same source.
    mine = f"dspark-patch-test/publish-apply:{uuid.uuid4().hex[:10]}"
    try:
        subprocess.run(["docker", "--config", str(config), "pull", "-q", dest], check=True, capture_output=True)
        verify = run("verify", "--image", dest, "--pull", "never", "--report-dir", str(tmp_path / "verify"))
        assert verify.returncode == 0, verify.stderr[-2000:]
        apply = run("apply", "--image", official_image(), "--pull", "never", "--tag", mine,
                    "--report-dir", str(tmp_path / "apply"))
        assert apply.returncode == 0, apply.stderr[-2000:]
        pushed, applied = (json.loads(subprocess.run(["docker", "image", "inspect", ref], capture_output=True,
                                                     text=True, check=True).stdout)[0] for ref in (dest, mine))
        assert pushed["Config"] == applied["Config"]   # every field, our labels (report digest too) included
        assert pushed["RootFS"]["Layers"][:-1] == applied["RootFS"]["Layers"][:-1]
        assert len(pushed["RootFS"]["Layers"]) == len(applied["RootFS"]["Layers"])
        files = " ".join(f"{SITE}/{rel}" for rel in sorted(VARIANT.files))
        sums = [subprocess.run(["docker", "run", "--rm", "--network", "none", "--entrypoint", "sha256sum", ref,
                                *files.split()], capture_output=True, text=True, check=True).stdout for ref in (dest, mine)]
        assert sums[0] == sums[1] and all(h.post_sha256 in sums[0] for h in VARIANT.files.values())
    finally:
        subprocess.run(["docker", "rmi", "-f", mine, dest], capture_output=True, check=False)


def test_verify_via_registry_passes_the_published_image_with_no_engine(login_registry, published,
                                                                      tmp_path: Path) -> None:
    dest, said = published[0], published[1].json
    env = _env(login_registry, tmp_path)
    for via in (("--via", "registry"), ()):   # auto: no engine answers, so the registry
        done = run("verify", "--image", dest, *via, "--json", "--report-dir", str(tmp_path / f"v{len(via)}"), env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        report = done.json
        assert report["status"] == "verified" and report["target"]["image"]["repo_digest"] == said["repo_digest"]
        integrity = report["integrity"]
        assert integrity["checked"] > 5000 and integrity["reference"].startswith("vllm-0.33.0-")
        assert integrity["bytecode_checked"] == len(VARIANT.files)   # this host runs the image's 3.11: recompiled
        assert {f["path"]: f["post_sha256"] for f in report["files"]} == {
            p: h.post_sha256 for p, h in VARIANT.files.items()}
        steps = {s["name"]: s["status"] for s in report["steps"]}
        assert steps["labels"] == steps["layer"] == "ok" and steps["probe"] == "skipped"
        assert any("holds only the series' files" in n for n in report["notes"])


def _built(tmp_path: Path, dockerfile: str, files: dict[str, bytes] | None = None, *,
           labels: dict[str, str] | None = None) -> str:
    context = tmp_path / "context"
    context.mkdir()
    (context / "Dockerfile").write_text(dockerfile)
    for name, data in (files or {}).items():
        (context / name).write_bytes(data)
    tag = f"dspark-patch-test/publish-crafted:{uuid.uuid4().hex[:10]}"
    argv = ["docker", "build", "-q", "--network", "none", "-t", tag, *(a for k, v in (labels or {}).items() for a in ("--label", f"{k}={v}")),
            str(context)]
    subprocess.run(argv, check=True, capture_output=True)
    return tag


@pytest.mark.parametrize("case", ["the source, unpatched", "the source under forged labels",
                                  "a file put on top of the published image",
                                  "vllm/ handed to another user on top of the published image"])
def test_verify_via_registry_fails_an_image_that_does_not_carry_exactly_the_patch(
        case: str, login_registry, sources: dict[str, str], published, tmp_path: Path) -> None:
    address, config, _ = login_registry
    dest = published[0]
    env = _env(login_registry, tmp_path)
    ref, local = sources["0.33.0"], None
    try:
        if case == "the source under forged labels":
            labels = json.loads(subprocess.run(["skopeo", "inspect", "--config", "--tls-verify=false", "--authfile",
                                                str(config / "config.json"), f"docker://{dest}"], capture_output=True,
                                               text=True, check=True).stdout)["config"]["Labels"]
            local = _built(tmp_path, f"FROM {official_image()}\n", labels=labels)
        elif case == "a file put on top of the published image":
            subprocess.run(["docker", "--config", str(config), "pull", "-q", dest], check=True, capture_output=True)
            local = _built(tmp_path, f"FROM {dest}\nCOPY extra.py {SITE}/vllm/extra.py\n",
                           {"extra.py": b"print('not reviewed')\n"})
        elif case == "vllm/ handed to another user on top of the published image":
            # a top layer of only vllm/'s folder entry, owned by 1234 and writable by all: the
            # paths are those a layer of ours holds, its header is not what apply writes
            subprocess.run(["docker", "--config", str(config), "pull", "-q", dest], check=True, capture_output=True)
            local = _built(tmp_path, f"FROM {dest}\nUSER root\nRUN chown 1234:1234 {SITE}/vllm && chmod 0777 {SITE}/vllm\n")
        if local is not None:
            ref = f"{address}/team/crafted:{uuid.uuid4().hex[:10]}"
            push_only_to_registry(local, ref, config)
        done = run("verify", "--image", ref, "--via", "registry", "--report-dir", str(tmp_path / "verify"), env=env)
        line = done.assert_clean_error(1)
        assert "does not carry exactly dspark-skip-mtp-buffer" in line
        if case == "a file put on top of the published image":
            assert "vllm/extra.py" in line and "top layer" in done.stdout + line
        elif case.startswith("vllm/ handed"):
            assert f"{SITE}/vllm in the top layer has mode 0777, owner 1234:1234, where apply writes mode 0755" in line
        else:
            assert "vllm/envs.py is not the series' post-image" in line
    finally:
        if local is not None:
            subprocess.run(["docker", "rmi", "-f", local, dest], capture_output=True, check=False)


def _edited_report(out: Path, tmp_path: Path, edit) -> Path:
    data = json.loads((out / "r/audit.json").read_text())
    edit(data)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(data))
    return path


def _rewritten_layer(out: Path, tmp_path: Path, change) -> tuple[Path, Path]:
    """The job's layer rewritten by `change(members) -> members` (name -> (TarInfo, bytes)), and
    its report with the new layer's digest and size: what someone who edits both would publish."""
    members = {}
    with tarfile.open(out / "layer.tar") as tar:
        for m in tar.getmembers():
            members[m.name] = (m, tar.extractfile(m).read() if m.isfile() else b"")
    members = change(members)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members.values():
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    layer = tmp_path / "layer.tar"
    layer.write_bytes(buf.getvalue())

    def digest(data: dict) -> None:
        data["layer"]["diff_id"] = "sha256:" + hashlib.sha256(buf.getvalue()).hexdigest()
        data["layer"]["size"] = len(buf.getvalue())

    return layer, _edited_report(out, tmp_path, digest)


def _one_more(members):
    folder = f"{SITE.lstrip('/')}/vllm"
    info = tarfile.TarInfo(f"{folder}/extra.py")
    info.mode = 0o644
    members[info.name] = (info, b"print('not the reviewed patch')\n")
    return members


def _one_less(members):
    pyc = next(name for name in members if name.endswith("envs.cpython-311.pyc"))
    return {name: m for name, m in members.items() if name != pyc}


def _other_bytecode(members):
    """envs.py's .pyc replaced by a .pyc of another source (a valid header of Python 3.11)."""
    import importlib._bootstrap_external as be
    import py_compile  # noqa: F401  (the same module apply uses)

    pyc = next(name for name in members if name.endswith("envs.cpython-311.pyc"))
    source = b"import os\nprint('another source')\n"
    code = compile(source, "envs.py", "exec")
    data = bytes(be._code_to_hash_pyc(code, __import__("importlib.util").util.source_hash(source), True))
    info, _ = members[pyc]
    members[pyc] = (info, data)
    return members


def _folder(members, change):
    """The layer with the vllm/ folder entry's header changed by `change(info)`."""
    name = f"{SITE.lstrip('/')}/vllm"
    info, data = members[name]
    change(info)
    members[name] = (info, data)
    return members


def _opaque_xattr(info) -> None:
    info.pax_headers = {"SCHILY.xattr.trusted.overlay.opaque": "y"}   # overlayfs then hides vllm/'s lower files


def _writable_by_all(info) -> None:
    info.uid, info.gid, info.mode = 1234, 1234, 0o777   # the serving user could write a .pth above vLLM


def _setuid_source(members):
    name = f"{SITE.lstrip('/')}/vllm/envs.py"
    info, data = members[name]
    info.mode = 0o4755
    members[name] = (info, data)
    return members


BAD = {
    "a report whose pre-image hash was edited": (
        lambda out, tmp: (out / "layer.tar", _edited_report(out, tmp, lambda d: d["files"][0].update(pre_sha256="0" * 64))),
        "not the reviewed ones"),
    "a report for another layer": (
        lambda out, tmp: (out / "layer.tar", _edited_report(out, tmp, lambda d: d["layer"].update(diff_id="sha256:" + "1" * 64))),
        "but the report's is"),
    "a layer with one file more": (lambda out, tmp: _rewritten_layer(out, tmp, _one_more), "extra.py"),
    "a layer with one file less": (lambda out, tmp: _rewritten_layer(out, tmp, _one_less), "not the report's changes"),
    "bytecode of another source": (lambda out, tmp: _rewritten_layer(out, tmp, _other_bytecode), "hash of another source"),
    "an overlay opaque xattr on vllm/": (
        lambda out, tmp: _rewritten_layer(out, tmp, lambda m: _folder(m, _opaque_xattr)),
        "PAX record SCHILY.xattr.trusted.overlay.opaque: an overlayfs xattr"),
    "vllm/ owned by another user, writable by all": (
        lambda out, tmp: _rewritten_layer(out, tmp, lambda m: _folder(m, _writable_by_all)),
        "has mode 0777, owner 1234:1234, where apply --image of the source would write mode 0755, owner 0:0"),
    "a patched file made setuid": (lambda out, tmp: _rewritten_layer(out, tmp, _setuid_source),
                                   "envs.py in the layer has mode 4755"),
    "a report of a run that failed": (
        lambda out, tmp: (out / "layer.tar", _edited_report(out, tmp, lambda d: d.update(status="failed", exit_code=1, errors=[
            {"kind": "probe-failed", "message": "the probe failed", "hint": None, "exit_code": 1}]))),
        "ended 'failed'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2_and_nothing_is_pushed(
        case: str, login_registry, sources: dict[str, str], jobs: dict[str, Path], tmp_path: Path) -> None:
    address, config, log = login_registry
    make, said = BAD[case]
    layer, report = make(jobs["0.33.0"], tmp_path)
    dest = f"{address}/team/refused:{uuid.uuid4().hex[:10]}"
    start = log.stat().st_size
    done = _publish(sources["0.33.0"], layer, report, dest, _env(login_registry, tmp_path))
    assert said in done.assert_clean_error(2)
    assert _writes(log, start) == [] and not _tag_there(address, config, dest)


@pytest.mark.parametrize("pair, onto, said", [
    ("0.32.0", "0.33.0", "is for vLLM 0.32.0, but"),        # a report and layer for another release
    # onto another image of the same release, site folder and pre-images: pip wrote bytecode
    # there, which the layer would replace where the report says it adds it
    ("0.33.0", "pip", "not the report's changes against the source (first: A "),
])
def test_a_layer_and_report_from_another_image_are_refused(
        pair: str, onto: str, said: str, login_registry, sources: dict[str, str], jobs: dict[str, Path],
        tmp_path: Path) -> None:
    address, config, log = login_registry
    dest = f"{address}/team/refused:{uuid.uuid4().hex[:10]}"
    start = log.stat().st_size
    done = _publish(sources[onto], jobs[pair] / "layer.tar", jobs[pair] / "r/audit.json", dest,
                    _env(login_registry, tmp_path))
    assert said in done.assert_clean_error(2)
    assert _writes(log, start) == [] and not _tag_there(address, config, dest)


def test_another_images_layer_with_this_report_is_refused_by_its_digest(
        login_registry, sources: dict[str, str], jobs: dict[str, Path], tmp_path: Path) -> None:
    address, config, log = login_registry
    dest = f"{address}/team/refused:{uuid.uuid4().hex[:10]}"
    done = _publish(sources["0.33.0"], jobs["0.32.0"] / "layer.tar", jobs["0.33.0"] / "r/audit.json", dest,
                    _env(login_registry, tmp_path))
    assert "but the report's is" in done.assert_clean_error(2)
    assert not _tag_there(address, config, dest)


def test_a_tag_that_exists_is_not_moved_without_force(
        login_registry, sources: dict[str, str], jobs: dict[str, Path], tmp_path: Path) -> None:
    address, config, log = login_registry
    env = _env(login_registry, tmp_path)
    out = jobs["0.33.0"]
    taken = sources["0.32.0"]   # an image already under the tag
    before = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--authfile",
                             str(config / "config.json"), f"docker://{taken}"], capture_output=True, check=True).stdout
    refused = _publish(sources["0.33.0"], out / "layer.tar", out / "r/audit.json", taken, env)
    assert "exists in its registry" in refused.assert_clean_error(2)
    after = subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--authfile",
                            str(config / "config.json"), f"docker://{taken}"], capture_output=True, check=True).stdout
    assert after == before
    moved = _publish(sources["0.33.0"], out / "layer.tar", out / "r/audit.json", f"{address}/team/moved:x", env)
    assert moved.returncode == 0, moved.stderr
    again = _publish(sources["0.33.0"], out / "layer.tar", out / "r/audit.json", f"{address}/team/moved:x", env,
                     "--force")
    assert again.returncode == 0 and "OK: published" in again.stdout, again.stderr


def test_the_dockerfile_recipe_writes_a_layer_that_publishes_with_no_engine(
        login_registry, sources: dict[str, str], tmp_path: Path) -> None:
    """docs/ci.md's Dockerfile shape: a stage FROM the serving image that runs the in-image apply
    (the tool copied in, not installed into the image's packages); its outputs taken out of the
    built stage with `docker cp`, then published onto the source by a run with no engine."""
    address, config, log = login_registry
    context = tmp_path / "context"
    tool_folder(context / "dspark-patch")
    (context / "Dockerfile").write_text(
        f"FROM {official_image()} AS patched\n"
        "USER root\n"
        "COPY dspark-patch /tmp/dspark-patch\n"
        f"RUN PYTHONPATH=/tmp/dspark-patch python3 -m dspark_patch apply --root {SITE} "
        "--layer-out /tmp/layer.tar --report-dir /tmp/reports\n")
    stage = f"dspark-patch-test/publish-stage:{uuid.uuid4().hex[:10]}"
    container = None
    try:
        subprocess.run(["docker", "build", "--network", "none", "-q", "-t", stage, str(context)], check=True,
                       capture_output=True, env={**os.environ, "DOCKER_BUILDKIT": "0"})
        container = subprocess.run(["docker", "create", stage], capture_output=True, text=True, check=True).stdout.strip()
        out = tmp_path / "out"
        out.mkdir()
        for name in ("layer.tar", "reports"):
            subprocess.run(["docker", "cp", f"{container}:/tmp/{name}", str(out / name)], check=True, capture_output=True)
    finally:
        if container:
            subprocess.run(["docker", "rm", "-f", container], capture_output=True, check=False)
        subprocess.run(["docker", "rmi", "-f", stage], capture_output=True, check=False)
    dest = f"{address}/team/served:dockerfile-{uuid.uuid4().hex[:6]}"
    env = _env(login_registry, tmp_path)
    done = _publish(sources["0.33.0"], out / "layer.tar", out / "reports/audit.json", dest, env)
    assert done.returncode == 0 and "OK: published" in done.stdout, done.stderr[-3000:]
    verify = run("verify", "--image", dest, "--via", "registry", "--report-dir", str(tmp_path / "verify"), env=env)
    assert verify.returncode == 0 and "verdict: OK: verified" in verify.stderr, verify.stderr[-2000:]


def test_sign_key_attaches_an_attestation_that_verifies_with_no_engine(
        login_registry, sources: dict[str, str], jobs: dict[str, Path], tmp_path: Path) -> None:
    from tests.support.keys import keyid, make_key

    address, _, _ = login_registry
    env = _env(login_registry, tmp_path)
    key, other = make_key(tmp_path / "keys", "ci"), make_key(tmp_path / "keys", "other")
    out = jobs["0.33.0"]
    dest = f"{address}/team/served:signed-{uuid.uuid4().hex[:6]}"
    done = _publish(sources["0.33.0"], out / "layer.tar", out / "r/audit.json", dest, env,
                    "--sign-key", str(key.private), "--report-dir", str(tmp_path / "published"))
    assert done.returncode == 0, done.stderr[-3000:]
    attached = json.loads((tmp_path / "published/audit.json").read_text())["attestations"]
    assert [(a["state"], a["keyid"]) for a in attached] == [("attached", keyid(key.public))]
    checked = run("verify", "--image", dest, "--attestation", "--key", str(key.public),
                  "--report-dir", str(tmp_path / "checked"), env=env)
    assert checked.returncode == 0, checked.stderr[-2000:]
    # The job ran the probe, in the image: the publisher carries its result as the job's claim.
    claim = "claimed by the in-image job, not verified by the publisher"
    assert json.loads((tmp_path / "published/audit.json").read_text())["probe"]["claimed_by"] == "in-image job"
    assert [a["probe"] for a in json.loads((tmp_path / "checked/audit.json").read_text())["attestations"]] == ["claimed"]
    assert claim in checked.stderr
    proven = run("verify", "--image", dest, "--attestation", "--key", str(key.public), "--require-proven-probe",
                 "--report-dir", str(tmp_path / "proven"), env=env)
    assert claim in proven.assert_clean_error(1)
    wrong = run("verify", "--image", dest, "--attestation", "--key", str(other.public),
                "--report-dir", str(tmp_path / "wrong"), env=env)
    assert wrong.returncode == 1, wrong.stderr[-2000:]


class _MovingSource:
    """A loopback proxy in front of the registry that serves `moved`'s manifest for `tag` from the
    second GET on: a source tag that moves while publish runs (a fault no real registry can be
    made to show on cue)."""

    def __init__(self, upstream: str, repository: str, tag: str, moved: str) -> None:
        import http.server
        import threading

        import requests

        gets = {"count": 0}
        path = f"/v2/{repository}/manifests/{tag}"

        class Handler(http.server.BaseHTTPRequestHandler):
            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "content-length")}

                def forward(target: str) -> requests.Response:
                    return requests.request(self.command, f"http://{upstream}{target}", headers=headers, data=body,
                                            allow_redirects=False, timeout=60)

                answer = forward(self.path)
                if self.command == "GET" and self.path == path and answer.status_code == 200:  # not a login challenge
                    gets["count"] += 1
                    if gets["count"] >= 2:
                        answer = forward(f"/v2/{repository}/manifests/{moved}")
                self.send_response(answer.status_code)
                for key, value in answer.headers.items():
                    if key.lower() not in ("transfer-encoding", "content-length", "connection", "content-encoding"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(answer.content)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(answer.content)

            do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = _forward

            def log_message(self, *args) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.address = f"127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_source_that_moves_while_publish_runs_is_refused_and_nothing_is_pushed(
        login_registry, sources: dict[str, str], jobs: dict[str, Path], tmp_path: Path) -> None:
    address, config, log = login_registry
    env = _env(login_registry, tmp_path)
    # the layers' scans in the cache first, so that only manifests and configs go through the proxy
    warm = run("status", "--via", "registry", "--image", sources["0.33.0"], env=env)
    assert warm.returncode == 0, warm.stderr[-2000:]
    proxy = _MovingSource(address, "team/vllm", "0.33.0", "0.32.0")
    try:
        proxied = tmp_path / "proxied-config"
        proxied.mkdir()
        auths = json.loads((config / "config.json").read_text())
        auths["auths"][proxy.address] = auths["auths"][address]
        (proxied / "config.json").write_text(json.dumps(auths))
        out = jobs["0.33.0"]
        dest = f"{proxy.address}/team/moved-source:x"
        start = log.stat().st_size
        done = _publish(f"{proxy.address}/team/vllm:0.33.0", out / "layer.tar", out / "r/audit.json", dest,
                        {**env, "DOCKER_CONFIG": str(proxied)})
        line = done.assert_clean_error(2)
        assert "named sha256:" in line and "now" in line
        assert _writes(log, start) == [] and not _tag_there(address, config, f"{address}/team/moved-source:x")
    finally:
        proxy.close()


def test_a_job_in_the_pip_made_fixture_publishes_and_verifies_with_no_engine(
        login_registry, sources: dict[str, str], tmp_path: Path) -> None:
    """The pip shape (bytecode pip compiled, USER vllm): the job's layer replaces envs.py's .pyc,
    with the mode and owner apply writes, and publishes; both verify routes pass it."""
    address, _, _ = login_registry
    out = tmp_path / "job"
    done = _job(tool_folder(tmp_path / "tool" / "dspark-patch"), out, APPLY, user="0", image=fixture_image())
    assert done.returncode == 0, done.stderr[-3000:]
    env = _env(login_registry, tmp_path)
    dest = f"{address}/team/pip-made:0.33.0-dspark"
    published = _publish(sources["pip"], out / "layer.tar", out / "r/audit.json", dest, env, "--json")
    assert published.returncode == 0, published.stderr[-3000:]
    assert published.json["bytecode_checked"] == published.json["bytecode_recompiled"] == len(VARIANT.files)
    checked = run("verify", "--image", dest, "--via", "registry", "--report-dir", str(tmp_path / "verify"), env=env)
    assert checked.returncode == 0, checked.stderr[-3000:]
    _, config, _ = login_registry
    try:   # and the engine's verify of it, pulled (the probe run in the image)
        engine = run("verify", "--image", dest, "--report-dir", str(tmp_path / "engine"), env={"DOCKER_CONFIG": str(config)})
        assert engine.returncode == 0, engine.stderr[-3000:]
    finally:
        subprocess.run(["docker", "rmi", "-f", dest], capture_output=True, check=False)
