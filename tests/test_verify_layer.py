"""`verify --image` (the engine route) compares the top layer with the layers under it, as
`verify --via registry` does: a layer of ours holds only the patched files, their bytecode and
the folders above them, each with the mode and owner `apply --image` writes. The layers come
from the scan cache; where it lacks one (reading it is a save of the whole image) the report says
the top layer was not compared, and how to have it compared."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from tests.support.cli import run
from tests.support.images import fixture_image

pytestmark = pytest.mark.engine

SITE = "/usr/local/lib/python3.11/dist-packages"


def _build(tmp_path: Path, dockerfile: str) -> str:
    context = tmp_path / f"context-{uuid.uuid4().hex[:6]}"
    context.mkdir()
    (context / "Dockerfile").write_text(dockerfile)
    tag = f"dspark-patch-test/verify-layer:{uuid.uuid4().hex[:10]}"
    subprocess.run(["docker", "build", "-q", "--network", "none", "-t", tag, str(context)], check=True,
                   capture_output=True)
    return tag


def test_verify_on_the_engine_fails_a_top_layer_that_hands_vllm_to_another_user(tmp_path: Path) -> None:
    result = f"dspark-patch-test/verify-layer:{uuid.uuid4().hex[:10]}"
    crafted = None
    try:
        applied = run("apply", "--image", fixture_image(), "--tag", result, "--pull", "never", "--no-probe",
                      "--strict-layers", "--report-dir", str(tmp_path / "a"))
        assert applied.returncode == 0, applied.stderr[-2000:]
        # the genuine result: every layer in the scan cache (apply kept the source's and its own)
        genuine = run("verify", "--image", result, "--pull", "never", "--no-probe", "--json",
                      "--report-dir", str(tmp_path / "v"))
        assert genuine.returncode == 0, genuine.stderr[-2000:]
        steps = {s["name"]: s["status"] for s in genuine.json["steps"]}
        assert steps["layer"] == "ok"
        assert any("the top layer" in n and "holds only" in n for n in genuine.json["notes"]), genuine.json["notes"]

        # a top layer of only vllm/'s folder entry, owned by 1234 and writable by all: the labels
        # are inherited, the files are the reviewed ones, only the folder's header is not apply's
        crafted = _build(tmp_path, f"FROM {result}\nUSER root\nRUN chown 1234:1234 {SITE}/vllm && chmod 0777 {SITE}/vllm\n")
        cold = run("verify", "--image", crafted, "--pull", "never", "--no-probe", "--json",
                   "--report-dir", str(tmp_path / "c"))
        said = [n for n in cold.json["notes"] if "were not compared with the layers under it" in n]
        assert said and "1 of " in said[0] and "`status --via layers`" in said[0], cold.json["notes"]

        status = run("status", "--via", "layers", "--image", crafted, "--pull", "never", "--json")
        assert status.returncode in (0, 1), status.stderr[-2000:]   # it reads and keeps every layer
        warm = run("verify", "--image", crafted, "--pull", "never", "--no-probe",
                   "--report-dir", str(tmp_path / "w"))
        line = warm.assert_clean_error(1)
        assert "does not carry exactly dspark-skip-mtp-buffer" in line
        assert f"{SITE}/vllm in the top layer has mode 0777, owner 1234:1234, where apply writes mode 0755" in line
    finally:
        subprocess.run(["docker", "rmi", "-f", *(t for t in (crafted, result) if t)], capture_output=True, check=False)
