"""What the written evidence may hold (docs/evidence.md): no credential, no engine address, no
home folder, no host environment, no checkout location, in any report file a command writes."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from dspark_patch.patchset import resolve
from dspark_patch.report.evidence import redact
from tests.support.cli import run

PY = sys.executable
ENV = {"HOME": "/home/alice", "DOCKER_HOST": "tcp://10.1.2.3:2376"}


@pytest.mark.parametrize(("text", "published"), [
    ("pulling alice:pw@reg.example:5000/repo:tag failed", "pulling ***@reg.example:5000/repo:tag failed"),
    ("cannot reach a Docker engine at tcp://10.1.2.3:2376: refused",
     "cannot reach a Docker engine at $DOCKER_HOST: refused"),
    ("no engine at ssh://bob@buildhost", "no engine at ssh://***@buildhost"),
    ("refused the credentials for it in /home/alice/.docker/config.json",
     "refused the credentials for it in ~/.docker/config.json"),
    ("/home/alice/work/org/repo/p.patch: bad", "~/work/org/repo/p.patch: bad"),
    # a home folder inside the image (its USER's site, which runs first) is a finding: kept
    ("/home/vllm/.local/lib/python3.11/site-packages/vllm.py: imported before",
     "/home/vllm/.local/lib/python3.11/site-packages/vllm.py: imported before"),
    ("git+https://u:tok@git.example/x.git", "git+https://***@git.example/x.git"),
    # What evidence is for stays: digests, paths inside the image, addresses in the docs.
    ("repo@sha256:" + "ab" * 32, "repo@sha256:" + "ab" * 32),
    ("/usr/lib/python3/dist-packages/vllm/envs.py differs", "/usr/lib/python3/dist-packages/vllm/envs.py differs"),
])
def test_error_lines_are_redacted_for_reports(text: str, published: str) -> None:
    assert redact(text, ENV) == published


def _written(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(folder.rglob("*")) if p.is_file())


def test_the_engine_address_stays_on_stderr_and_out_of_every_report(tmp_path: Path) -> None:
    host = "unix:///run/CANARY7-engine/docker.sock"
    for command in ("apply", "verify"):
        res = run(command, "--image", "127.0.0.1:5000/x:1", "--report-dir", str(tmp_path / command),
                  "--junit", str(tmp_path / command / "extra-junit.xml"), env={"DOCKER_HOST": host})
        assert res.returncode == 3, res.stderr
        assert (tmp_path / command / "audit.json").exists()
        assert "CANARY7" not in _written(tmp_path / command)
        assert "$DOCKER_HOST" in (tmp_path / command / "audit.json").read_text()


def test_no_canary_reaches_any_report_of_apply_verify_and_status(vllm033_tree: Path, tmp_path: Path) -> None:
    # The patch set as a checkout somewhere under a user's home, and a secret in the environment.
    checkout = tmp_path / "home" / "CANARY7-user" / "CANARY7-checkout"
    shutil.copytree(resolve("dspark-skip-mtp-buffer").source, checkout / "dspark-skip-mtp-buffer")
    patch = str(checkout / "dspark-skip-mtp-buffer")
    env = {"SECRET_TOKEN": "CANARY7-env-value", "HF_TOKEN": "hf_CANARY7_token"}
    reports = tmp_path / "reports"
    for name, args in (
        ("apply", ["apply", "--root", str(vllm033_tree), "--python", PY, "--patch", patch, "--no-probe"]),
        ("verify", ["verify", "--root", str(vllm033_tree), "--python", PY, "--patch", patch, "--no-probe"]),
        ("status", ["status", "--root", str(vllm033_tree)]),
    ):
        res = run(*args, "--report-dir", str(reports / name), env=env)
        assert res.returncode == 0, (name, res.stderr)
    written = _written(reports)
    assert "CANARY7" not in written
    assert '"source": "vllm-0.33.0.patch"' in (reports / "apply" / "audit.json").read_text()


def test_no_canary_reaches_what_port_writes_into_the_patch_set(tmp_path: Path) -> None:
    # What port writes into the patch set (the variant, its review, its census, patch.toml) is
    # committed and published with it: nothing of the host, the checkout's location or the work
    # folder's may be in it, nor in what --json prints.
    from tests.support import vllm

    home = tmp_path / "CANARY7-home"
    checkout = home / "CANARY7-checkout" / "vllm-math-positive-divisor"
    shutil.copytree(Path(__file__).parent / "data" / "patchsets" / "vllm-math-positive-divisor", checkout)
    before = {p.name for p in checkout.iterdir()}
    res = run("port", "--patch", str(checkout), "--to", "0.32.0", "--wheel", str(vllm.wheel("0.32.0")),
              "--work", str(home / "CANARY7-work"), "--python", PY, "--json",
              env={"HOME": str(home), "SECRET_TOKEN": "CANARY7-env-value", "HF_TOKEN": "hf_CANARY7_token"})
    assert res.returncode == 0, res.stderr
    assert {p.name for p in checkout.iterdir()} - before >= {"vllm-0.32.0.patch", "vllm-0.32.0.review.md"}
    assert "CANARY7" not in _written(checkout)
    # --json says where port wrote what a person reads or edits next, under the folders as
    # given (the user's own arguments, as evaluate's report_dir), and nothing else of the host.
    printed = json.loads(res.stdout)
    work = str(home / "CANARY7-work")
    assert printed.pop("work") == work and printed.pop("review_path").startswith(work + "/")
    assert printed.pop("diff_path") == str(checkout / "vllm-0.32.0.patch")
    assert all(f.pop("work_file").startswith(work + "/") for f in printed["files"]) and printed["files"]
    assert "CANARY7" not in json.dumps(printed)
