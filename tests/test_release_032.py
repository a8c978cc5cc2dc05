"""The shipped vllm-0.32.0 variant on a real 0.32.0 tree and on the 0.32.0 fixture image.

It was made by `dspark-patch port` (tests/test_port.py repeats that) and reviewed; here it must
do what the 0.33.0 variant does on its release: zero fuzz, the reviewed hashes, verify, status.
"""

from __future__ import annotations

import hashlib
import json
import sys
import uuid
from pathlib import Path

import docker
import pytest

from dspark_patch.patchset import resolve
from tests.support import vllm
from tests.support.cli import run
from tests.support.images import fixture_032_image

PY = sys.executable
VARIANT = resolve("dspark-skip-mtp-buffer").variant_for("0.32.0")


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return vllm.tree_copy("0.32.0", tmp_path / "site-packages")


def test_the_variant_is_reviewed_and_names_where_it_came_from() -> None:
    assert VARIANT.name == "vllm-0.32.0" and VARIANT.releases == ("0.32.0",)
    assert VARIANT.review == "reviewed" and VARIANT.ported_from == "vllm-0.33.0"


def _apply_and_verify(tree: Path, tmp_path: Path, *probe: str) -> None:
    res = run("apply", "--root", str(tree), "--python", PY, *probe, "--report-dir", str(tmp_path / "apply"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    audit = json.loads((tmp_path / "apply" / "audit.json").read_text())
    assert audit["status"] == "applied" and audit["patch"]["variant"] == "vllm-0.32.0"
    assert audit["patch"]["review"] == "reviewed" and audit["patch"]["hash_checks"] is True
    assert sorted(f["path"] for f in audit["files"]) == sorted(VARIANT.files)  # the loop below sees every file
    for f in audit["files"]:
        assert f["pre_sha256"] == VARIANT.files[f["path"]].pre_sha256
        assert f["post_sha256"] == VARIANT.files[f["path"]].post_sha256 == sha(tree / f["path"])
        assert f["hunks"] and all(h["fuzz"] == 0 for h in f["hunks"])
    assert audit["compile"]["ok"]
    res = run("verify", "--root", str(tree), "--python", PY, *probe, "--report-dir", str(tmp_path / "verify"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    res = run("status", "--root", str(tree), "--json", "--report-dir", str(tmp_path / "status"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    image = res.json["images"][0]
    assert image["release"] == "0.32.0"
    assert image["patch_sets"]["dspark-skip-mtp-buffer"] == "applied"
    assert image["unexplained"] == [] and image["missing"] == []


def test_applies_with_zero_fuzz_verifies_and_status_says_applied_without_the_probe(tree: Path, tmp_path: Path) -> None:
    _apply_and_verify(tree, tmp_path, "--no-probe")


def test_applies_verifies_and_probes_on_a_real_tree(tree: Path, tmp_path: Path) -> None:
    _apply_and_verify(tree, tmp_path)
    res = run("probe", "--root", str(tree), "--python", PY, "--json", "--report-dir", str(tmp_path / "probe"))
    assert res.returncode == 0, res.stderr
    assert res.json["probe"]["ok"] and res.json["probe"]["cases"]


@pytest.mark.engine
def test_applies_with_zero_fuzz_to_the_real_0_32_0_image_and_verifies(tmp_path: Path) -> None:
    client = docker.from_env()
    source = fixture_032_image()
    source_id = client.images.get(source).id
    tag = f"dspark-patch/test-result:port032-{uuid.uuid4().hex[:8]}"
    try:
        res = run("apply", "--image", source, "--pull", "never", "--tag", tag, "--json",
                  "--report-dir", str(tmp_path / "apply"))
        assert res.returncode == 0, (res.stdout[-2000:], res.stderr)
        audit = res.json
        assert audit["target"]["distribution"]["version"] == "0.32.0" and audit["probe"]["ok"]
        assert all(h["fuzz"] == 0 for f in audit["files"] for h in f["hunks"])
        assert {f["path"]: f["post_sha256"] for f in audit["files"]} == {
            p: h.post_sha256 for p, h in VARIANT.files.items()}
        assert client.images.get(source).id == source_id
        res = run("verify", "--image", tag, "--pull", "never", "--report-dir", str(tmp_path / "verify"))
        assert res.returncode == 0, (res.stdout[-2000:], res.stderr)
        res = run("verify", "--image", source, "--pull", "never", "--no-probe", "--report-dir", str(tmp_path / "v0"))
        assert res.returncode == 1 and "unpatched (it is the pre-image)" in res.stderr
        res = run("status", "--image", tag, "--image", source, "--pull", "never", "--json")
        assert res.returncode == 0, (res.stdout[-2000:], res.stderr)
        states = {i["ref"]: (i["release"], i["patch_sets"]["dspark-skip-mtp-buffer"]) for i in res.json["images"]}
        assert states == {tag: ("0.32.0", "applied"), source: ("0.32.0", "absent")}
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass
