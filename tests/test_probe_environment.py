"""A patch set's probe is code from the patch set: on `--root` it runs on this host, so it gets a
reduced environment (never the job's secrets), and the report names the probe's files and where
it ran. A real vLLM 0.33.0 tree through the CLI."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

from tests.support.cli import run

PY = sys.executable
MATH_SET = Path(__file__).parent / "data" / "patchsets" / "vllm-math-positive-divisor"

# A probe that reports the names of every environment variable it was given, as one case.
SNOOPING_PROBE = '''\
import json, os, sys
print(json.dumps({"schema": "dspark-patch/probe/v1", "ok": True,
                  "cases": [{"name": "env", "ok": True, "detail": " ".join(sorted(os.environ))}]}))
'''
SECRETS = {"SECRET_TOKEN": "planted-1", "HF_TOKEN": "planted-2", "AWS_SECRET_ACCESS_KEY": "planted-3",
           "AWS_ACCESS_KEY_ID": "planted-4", "GITHUB_TOKEN": "planted-5", "LC_ALL": "C.UTF-8"}


def test_the_probe_on_a_root_tree_sees_no_secret_of_the_job(vllm033_tree: Path, tmp_path: Path) -> None:
    patch_set = tmp_path / MATH_SET.name
    shutil.copytree(MATH_SET, patch_set)
    (patch_set / "probe.py").write_text(SNOOPING_PROBE, encoding="utf-8")
    res = run("probe", "--root", str(vllm033_tree), "--patch", str(patch_set), "--python", PY,
              "--report-dir", str(tmp_path / "r"), "--json", env=SECRETS)
    assert res.returncode == 0, res.stderr
    probe = res.json["probe"]
    seen = set(probe["cases"][0]["detail"].split())
    assert not seen & {"SECRET_TOKEN", "HF_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID", "GITHUB_TOKEN"}
    assert {"PATH", "LC_ALL", "CUDA_VISIBLE_DEVICES"} <= seen
    assert all(value not in res.stdout for value in ("planted-1", "planted-2", "planted-3"))
    # The report names the probe's code and where it ran, in audit.json and audit.md.
    # (named inside the patch set's folder, the same wherever the checkout is: docs/evidence.md)
    assert probe["source"].startswith("probe.py (sha256 ")
    assert probe["ran_in"].startswith(f"this host's {PY}, its environment reduced to PATH")
    saved = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert saved["probe"]["ran_in"] == probe["ran_in"]
    assert "The patch set's code" in (tmp_path / "r" / "audit.md").read_text()


def test_the_genuine_probe_still_passes_with_the_reduced_environment(patched033_tree: Path, tmp_path: Path) -> None:
    res = run("verify", "--root", str(patched033_tree), "--python", PY, "--report-dir", str(tmp_path / "r"),
              "--json", env=SECRETS)
    assert res.returncode == 0, res.stderr
    assert res.json["probe"]["ok"] and res.json["probe"]["ran"]
    assert "environment reduced" in res.json["probe"]["ran_in"]
