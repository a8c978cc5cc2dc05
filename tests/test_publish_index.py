"""`publish` of an amd64+arm64 index: one in-image job per platform, then the new index, with no
engine; the result beside what `apply --platform all --push` makes of the same index.

The source is the official shape on both platforms (uv, no bytecode, USER 2000), as one index in a
loopback registry behind a login. Each platform's job is a container of that platform's image
run as root with the tool mounted read-only (the arm64 one under qemu; its python is trixie's
3.13, so its tool folder holds Debian's arm64 packages of the tool's dependencies:
support/tool_folder.py). `publish` takes the two layers and reports as PLATFORM=FILE pairs and
refuses to publish the index without every platform's.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from dspark_patch.report.audit_json import read_report
from tests.support.cli import run
from tests.support.images import official_image
from tests.support.index import arm64_official_image, publish_index, remove_images_from
from tests.support.python313 import python313
from tests.support.registry import login_registry_in
from tests.support.tool_folder import tool_folder
from tests.test_publish import _rewritten_layer

pytestmark = [pytest.mark.engine, pytest.mark.registry, pytest.mark.emulation]

USER, PASSWORD = "publisher", "s3cret-for-the-index"
NO_ENGINE = "tcp://127.0.0.1:9"
HOST_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"   # no python3.13 on it
SITES = {"linux/amd64": "/usr/local/lib/python3.11/dist-packages",
         "linux/arm64": "/usr/local/lib/python3.13/dist-packages"}


@pytest.fixture(scope="module")
def index(tmp_path_factory: pytest.TempPathFactory):
    """(the login registry, the official index's ref) with the registry's login in DOCKER_CONFIG."""
    with login_registry_in(tmp_path_factory.mktemp("publish-index"), USER, PASSWORD) as reg, \
            pytest.MonkeyPatch.context() as env:
        env.setenv("DOCKER_CONFIG", str(reg.config))   # publish_index writes the index with our client
        try:
            found = publish_index(reg.address, repository="team/vllm", tag="0.33.0",
                                  sources=(official_image(), arm64_official_image()))
            yield reg, found.ref
        finally:
            remove_images_from(reg.address)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each platform's in-image job: its output folder (layer.tar, r/audit.json)."""
    found = {}
    for platform, image, arm64 in (("linux/amd64", official_image(), False),
                                   ("linux/arm64", arm64_official_image(), True)):
        tool = tool_folder(tmp_path_factory.mktemp("tool") / "dspark-patch", arm64=arm64)
        out = tmp_path_factory.mktemp(f"job-{platform.replace('/', '-')}")
        out.chmod(0o777)
        done = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "--platform", platform, "--user", "0",
             "--name", f"dspark-test-publish-index-{uuid.uuid4().hex[:10]}", "-v", f"{tool}:/opt/dspark-patch:ro",
             "-v", f"{out}:/out", "-e", "PYTHONPATH=/opt/dspark-patch", "--entrypoint", "python3", image,
             "-m", "dspark_patch", "apply", "--root", SITES[platform], "--layer-out", "/out/layer.tar",
             "--report-dir", "/out/r"], capture_output=True, text=True, timeout=900, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        found[platform] = out
    return found


def _pairs(jobs: dict[str, Path], platforms=("linux/amd64", "linux/arm64")) -> list[str]:
    argv = []
    for platform in platforms:
        argv += ["--layer", f"{platform}={jobs[platform] / 'layer.tar'}", "--report",
                 f"{platform}={jobs[platform] / 'r/audit.json'}"]
    return argv


def _config(ref: str, config: Path, platform: str) -> dict:
    arch = platform.split("/")[1]
    return json.loads(subprocess.run(
        ["skopeo", "inspect", "--config", "--tls-verify=false", "--override-arch", arch, "--authfile",
         str(config / "config.json"), f"docker://{ref}"], capture_output=True, text=True, check=True).stdout)


def test_an_index_is_published_from_one_job_per_platform_and_verifies_with_and_without_an_engine(
        index, jobs: dict[str, Path], tmp_path: Path) -> None:
    reg, source = index
    env = {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(reg.config), "DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    dest = f"{reg.address}/team/vllm:0.33.0-dspark"

    # Without the arm64 job's files the index is not published.
    missing = run("publish", "--image", source, *_pairs(jobs, ("linux/amd64",)), "--tag", dest, env=env)
    assert "no --layer/--report for linux/arm64/v8" in missing.assert_clean_error(2)
    assert subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--authfile",
                           str(reg.config / "config.json"), f"docker://{dest}"], capture_output=True).returncode != 0

    # The arm64 layer's bytecode is Python 3.13's: with no interpreter of that minor to recompile
    # it, its header alone is no proof, and nothing is published.
    refused = run("publish", "--image", source, *_pairs(jobs), "--tag", dest, env={**env, "PATH": HOST_PATH})
    assert "this host has no Python 3.13 to recompile it" in refused.assert_clean_error(2)
    done = run("publish", "--image", source, *_pairs(jobs), "--tag", dest, "--json", "--python", str(python313()),
               "--report-dir", str(tmp_path / "published"), env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    said = done.json
    assert said["platforms"] == ["linux/amd64", "linux/arm64/v8"]
    assert said["bytecode_checked"] == said["bytecode_recompiled"] == 4   # every .pyc recompiled, 3.13's too
    assert said["notes"] == ["the probe's result is claimed by the in-image job, not verified by the publisher "
                             "(it runs nothing)"]   # and no note stands in for a proof
    # two layers and two configs sent; every base layer of both platforms already in team/vllm,
    # none sent again
    base = sum(len(_config(source, reg.config, p)["rootfs"]["diff_ids"]) for p in ("linux/amd64", "linux/arm64"))
    assert said["sent"]["uploaded"] == 4 and said["sent"]["copied_bytes"] == 0
    assert said["sent"]["present"] + said["sent"]["mounted"] == base
    assert said["sent"]["bytes"] < said["layer_size"]
    read_report(tmp_path / "published/audit.json")   # a valid audit report (its schema)
    report = json.loads((tmp_path / "published/audit.json").read_text())
    assert [p["platform"] for p in report["platforms"]] == ["linux/amd64", "linux/arm64/v8"]
    assert report["index"]["result_digest"] == said["repo_digest"].rpartition("@")[2]

    # With no engine: verify (auto picks the registry) cannot prove the arm64 image's Python 3.13
    # bytecode on this 3.11 host with no python3.13: one line, exit 3, never a pass on its header.
    unproven = run("verify", "--image", dest, "--report-dir", str(tmp_path / "verify-unproven"),
                   env={**env, "PATH": HOST_PATH})
    assert "this host has no Python 3.13 to recompile it" in unproven.assert_clean_error(3)
    # With a 3.13 interpreter named, both platforms pass, every patched module's .pyc recompiled.
    verify = run("verify", "--image", dest, "--via", "registry", "--python", str(python313()), "--json",
                 "--report-dir", str(tmp_path / "verify-registry"), env={**env, "PATH": HOST_PATH})
    assert verify.returncode == 0, verify.stderr[-3000:]
    by_platform = {p["platform"]: p["report"] for p in verify.json["platforms"]}
    assert [r["status"] for r in by_platform.values()] == ["verified", "verified"]
    assert [r["integrity"]["bytecode_checked"] for r in by_platform.values()] == [2, 2]
    assert not any("not recompiled" in n for r in by_platform.values() for n in r["notes"])

    # With an engine: `verify --platform all` of the pushed index (each probe run, arm64's under
    # qemu), and `apply --platform all --push`
    # of the same source gives each platform the same config (our labels included).
    applied = f"{reg.address}/team/vllm:0.33.0-applied"
    res = run("verify", "--image", dest, "--platform", "all", "--json",
              "--report-dir", str(tmp_path / "verify-engine"), env={"DOCKER_CONFIG": str(reg.config)})
    assert res.returncode == 0, res.stderr[-3000:]
    assert [p["report"]["status"] for p in res.json["platforms"]] == ["verified", "verified"]
    res = run("apply", "--image", source, "--platform", "all", "--tag", applied, "--push",
              "--report-dir", str(tmp_path / "apply"), env={"DOCKER_CONFIG": str(reg.config)})
    assert res.returncode == 0, res.stderr[-3000:]
    for platform in ("linux/amd64", "linux/arm64"):
        mine, theirs = _config(dest, reg.config, platform), _config(applied, reg.config, platform)
        assert mine["config"] == theirs["config"], platform
        assert mine["rootfs"]["diff_ids"][:-1] == theirs["rootfs"]["diff_ids"][:-1], platform
        assert len(mine["rootfs"]["diff_ids"]) == len(theirs["rootfs"]["diff_ids"]), platform


_FORGE = r"""
import base64, importlib._bootstrap_external as be, sys
header_hash = base64.b64decode(sys.argv[1])
code = compile(b"import os\nos.environ['VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER'] = '0'\n", sys.argv[2], "exec")
sys.stdout.write(base64.b64encode(bytes(be._code_to_hash_pyc(code, header_hash, True))).decode())
"""


def _forged_313(members):
    """envs.cpython-313.pyc replaced by Python 3.13 bytecode of other code whose checked-hash
    header names the reviewed envs.py's source hash: what its header alone cannot tell."""
    import base64

    pyc = next(name for name in members if name.endswith("envs.cpython-313.pyc"))
    info, honest = members[pyc]
    forged = subprocess.run([str(python313()), "-I", "-S", "-B", "-c", _FORGE, base64.b64encode(honest[8:16]).decode(),
                             "/" + pyc.replace("__pycache__/", "").replace(".cpython-313.pyc", ".py")],
                            capture_output=True, text=True, check=True, cwd="/").stdout
    members[pyc] = (info, base64.b64decode(forged))
    return members


def test_forged_bytecode_of_another_minor_is_recompiled_and_refused(index, jobs: dict[str, Path],
                                                                    tmp_path: Path) -> None:
    """A layer whose 3.13 .pyc is other code under the reviewed source's hash: publish from this
    3.11 host recompiles it with a 3.13 interpreter (--python) and refuses it; with none, it
    refuses the layer unproven. Nothing is tagged either way."""
    reg, source = index
    env = {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(reg.config), "DSPARK_PATCH_CACHE": str(tmp_path / "cache"),
           "PATH": HOST_PATH}
    layer, report = _rewritten_layer(jobs["linux/arm64"], tmp_path, _forged_313)
    dest = f"{reg.address}/team/vllm:forged-{uuid.uuid4().hex[:8]}"
    pairs = [*_pairs(jobs, ("linux/amd64",)), "--layer", f"linux/arm64={layer}", "--report", f"linux/arm64={report}"]
    for extra, said in ((["--python", str(python313())], "is not its source's code as Python 3.13 compiles it"),
                        ([], "this host has no Python 3.13 to recompile it")):
        done = run("publish", "--image", source, *pairs, "--tag", dest, *extra, env=env)
        assert said in done.assert_clean_error(2)
    assert subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", "--authfile",
                           str(reg.config / "config.json"), f"docker://{dest}"], capture_output=True).returncode != 0
    # an interpreter of another minor is not taken for the image's
    wrong = run("publish", "--image", source, *pairs, "--tag", dest, "--python", "/usr/bin/python3", env=env)
    assert "is not an interpreter of Python 3.13" in wrong.assert_clean_error(2)
