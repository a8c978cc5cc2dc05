"""`publish` proves what it can and labels the rest: the in-image report is the image's word.

Two things publish cannot prove from the registry are never taken from that report as facts:
- the probe ran in the image, where the publisher (no engine) cannot run it: the published report,
  the signed predicate and `verify --attestation` carry its result as claimed by the in-image job,
  not verified by the publisher, and `--require-proven-probe` refuses such a claim; a probe that
  did not run stays "not run";
- the review state of each patch set comes from the patch sets the publisher loads: an unreviewed
  one is refused (exit 2, one line, nothing pushed) unless `--allow-unreviewed`, and then the
  published report says unreviewed, whatever the job's report said.

Each hostile case is an in-image job's audit.json edited the way someone who controls the image
would edit it, published through the CLI against a real loopback registry.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.support.cli import run
from tests.support.images import official_image
from tests.support.keys import make_key
from tests.support.registry import login_registry_in, push_only_to_registry
from tests.support.tool_folder import tool_folder
from tests.test_in_image import APPLY, _job
from tests.test_publish import PASSWORD, USER, _edited_report, _env, _publish, _tag_there, _writes

pytestmark = pytest.mark.engine

TEAM_SET = Path(__file__).resolve().parent / "data" / "patchsets" / "vllm-math-positive-divisor"
CLAIM = "claimed by the in-image job, not verified by the publisher"


@pytest.fixture(scope="module")
def login_registry(tmp_path_factory: pytest.TempPathFactory):
    with login_registry_in(tmp_path_factory.mktemp("claims-registry"), USER, PASSWORD) as reg:
        yield reg


@pytest.fixture(scope="module")
def source(login_registry) -> str:
    address, config, _ = login_registry
    ref = f"{address}/team/vllm:0.33.0"
    push_only_to_registry(official_image(), ref, config)
    return ref


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two in-image jobs' outputs (layer.tar, r/audit.json): the shipped set with --no-probe, and a
    team's set from DSPARK_PATCH_PATH whose variant is unreviewed, applied with --allow-unreviewed
    (its folder is `team/` beside the outputs, for the publisher's DSPARK_PATCH_PATH too)."""
    tool = tool_folder(tmp_path_factory.mktemp("tool") / "dspark-patch")
    no_probe = tmp_path_factory.mktemp("job-no-probe")
    done = _job(tool, no_probe, f"{APPLY} --no-probe", user="0")
    assert done.returncode == 0, done.stderr[-3000:]
    unreviewed = tmp_path_factory.mktemp("job-unreviewed")
    team = unreviewed / "team" / TEAM_SET.name
    shutil.copytree(TEAM_SET, team)
    toml = team / "patch.toml"
    toml.write_text(toml.read_text().replace('diff = "vllm-0.33.0.patch"\n',
                                             'diff = "vllm-0.33.0.patch"\nreview = "unreviewed"\n'))
    script = (f"DSPARK_PATCH_PATH=/out/team {APPLY} --patch {TEAM_SET.name} --allow-unreviewed --no-probe")
    done = _job(tool, unreviewed, script, user="0")
    assert done.returncode == 0, done.stderr[-3000:]
    said = json.loads((unreviewed / "r/audit.json").read_text())
    assert said["patch"]["id"] == TEAM_SET.name and said["patch"]["review"] == "unreviewed"
    return {"no-probe": no_probe, "unreviewed": unreviewed}


def _signed_predicate(address: str, config: Path, audit: dict) -> dict:
    """The predicate of the envelope attached to the published image, read from the registry."""
    (attached,) = audit["attestations"]
    repository = attached["subject"].partition("@")[0]
    artifact = json.loads(subprocess.run(
        ["skopeo", "inspect", "--raw", "--tls-verify=false", "--authfile", str(config / "config.json"),
         f"docker://{repository}@{attached['artifact']}"], capture_output=True, text=True, check=True).stdout)
    path = repository.removeprefix(address + "/")
    request = urllib.request.Request(f"http://{address}/v2/{path}/blobs/{artifact['layers'][0]['digest']}")
    request.add_header("Authorization", "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as resp:
        envelope = json.loads(resp.read())
    return json.loads(base64.b64decode(envelope["payload"]))["predicate"]


def _probe_said_to_pass(data: dict) -> None:
    """What an image that skipped the probe would write to look as if it ran and passed."""
    data["probe"].update(ran=True, ok=True, detail="", cases=[
        {"name": "effect: the drafter gets no hidden-state buffer", "ok": True, "detail": "passed in the image"}])


def test_a_probe_the_job_says_ran_is_published_and_signed_as_its_claim_never_as_proven(
        login_registry, source: str, jobs: dict[str, Path], tmp_path: Path) -> None:
    address, config, _ = login_registry
    env = _env(login_registry, tmp_path)
    key = make_key(tmp_path / "keys", "ci")
    out = jobs["no-probe"]
    assert json.loads((out / "r/audit.json").read_text())["probe"]["ran"] is False   # the job did not run it
    report = _edited_report(out, tmp_path, _probe_said_to_pass)
    dest = f"{address}/team/served:claimed-{uuid.uuid4().hex[:6]}"
    done = _publish(source, out / "layer.tar", report, dest, env, "--sign-key", str(key.private),
                    "--report-dir", str(tmp_path / "published"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert CLAIM in done.stdout   # the publisher says so as it publishes

    # The published report and the predicate it signed: the job's result, labelled its claim.
    audit = json.loads((tmp_path / "published/audit.json").read_text())
    assert audit["probe"]["ran"] and audit["probe"]["claimed_by"] == "in-image job"
    assert any(CLAIM in n for n in audit["notes"])
    assert all(c["message"] == CLAIM for c in audit["checks"] if c["group"] == "probe")
    assert "Claimed by the in-image job, not verified by the publisher" in (tmp_path / "published/audit.md").read_text()
    predicate = _signed_predicate(address, config, audit)
    assert predicate["probe"]["claimed_by"] == "in-image job"
    assert all(c["message"] == CLAIM for c in predicate["checks"] if c["group"] == "probe")

    # verify --attestation: valid, the probe a claim, and a policy that wants a proven one refuses it.
    checked = run("verify", "--image", dest, "--attestation", "--key", str(key.public),
                  "--report-dir", str(tmp_path / "checked"), env=env)
    assert checked.returncode == 0, checked.stderr[-2000:]
    assert f"probe {CLAIM}" in checked.stderr
    (found,) = json.loads((tmp_path / "checked/audit.json").read_text())["attestations"]
    assert found["state"] == "valid" and found["probe"] == "claimed"
    strict = run("verify", "--image", dest, "--attestation", "--key", str(key.public), "--require-proven-probe",
                 "--report-dir", str(tmp_path / "strict"), env=env)
    line = strict.assert_clean_error(1)
    assert "probe not proven" in line and CLAIM in line


def test_a_probe_that_did_not_run_is_published_as_not_run(
        login_registry, source: str, jobs: dict[str, Path], tmp_path: Path) -> None:
    address, _, _ = login_registry
    env = _env(login_registry, tmp_path)
    key = make_key(tmp_path / "keys", "ci")
    out = jobs["no-probe"]
    dest = f"{address}/team/served:no-probe-{uuid.uuid4().hex[:6]}"
    done = _publish(source, out / "layer.tar", out / "r/audit.json", dest, env, "--sign-key", str(key.private),
                    "--report-dir", str(tmp_path / "published"))
    assert done.returncode == 0, done.stderr[-3000:]
    assert CLAIM not in done.stdout
    audit = json.loads((tmp_path / "published/audit.json").read_text())
    assert audit["probe"]["ran"] is False and audit["probe"]["claimed_by"] == ""
    checked = run("verify", "--image", dest, "--attestation", "--key", str(key.public),
                  "--report-dir", str(tmp_path / "checked"), env=env)
    assert "the probe did not pass" in checked.assert_clean_error(1)


@pytest.mark.parametrize("said", ["unreviewed", "reviewed"])
def test_an_unreviewed_set_is_refused_without_allow_unreviewed_whatever_the_report_says(
        said: str, login_registry, source: str, jobs: dict[str, Path], tmp_path: Path) -> None:
    address, config, log = login_registry
    out = jobs["unreviewed"]
    env = {**_env(login_registry, tmp_path), "DSPARK_PATCH_PATH": str(out / "team")}
    report = _edited_report(out, tmp_path, lambda d: d["patch"].update(review=said))
    dest = f"{address}/team/refused:{uuid.uuid4().hex[:10]}"
    start = log.stat().st_size
    done = _publish(source, out / "layer.tar", report, dest, env)
    line = done.assert_clean_error(2)
    assert f"patch set {TEAM_SET.name} variant vllm-0.33.0 is unreviewed" in line and "refusing to publish" in line
    assert "--allow-unreviewed" in done.stderr
    assert _writes(log, start) == [] and not _tag_there(address, config, dest)


def test_with_allow_unreviewed_the_published_report_says_unreviewed_though_the_job_said_reviewed(
        login_registry, source: str, jobs: dict[str, Path], tmp_path: Path) -> None:
    address, _, _ = login_registry
    out = jobs["unreviewed"]
    env = {**_env(login_registry, tmp_path), "DSPARK_PATCH_PATH": str(out / "team")}
    report = _edited_report(out, tmp_path, lambda d: (d["patch"].update(review="reviewed"), d.update(notes=[])))
    dest = f"{address}/team/served:unreviewed-{uuid.uuid4().hex[:6]}"
    done = _publish(source, out / "layer.tar", report, dest, env, "--allow-unreviewed",
                    "--report-dir", str(tmp_path / "published"))
    assert done.returncode == 0, done.stderr[-3000:]
    audit = json.loads((tmp_path / "published/audit.json").read_text())
    assert audit["patch"]["id"] == TEAM_SET.name and audit["patch"]["review"] == "unreviewed"
    assert "--allow-unreviewed: variant vllm-0.33.0 has not been reviewed by a person" in audit["notes"]
    assert "**unreviewed**" in (tmp_path / "published/audit.md").read_text()
    assert audit["result_image"]["repo_digest"].startswith(f"{address}/team/served@sha256:")
