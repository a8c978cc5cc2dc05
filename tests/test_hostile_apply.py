"""Hostile images through `apply` on the real engine (issue 16, classes 2, 3, 10).

Each image is the real 0.33.0 fixture's layers (the engine holds them) plus one layer written by
the test. `apply` must refuse it: exit 1 and one line, before anything is written; nothing tagged,
no container of the image left, the source image untouched. Built once per module, removed at
the end. The reader-level and status/verify checks of the same classes are in
test_hostile_layers.py.
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import images, vllm
from tests.support.cli import run
from tests.test_hostile_layers import SITE, _inspect, _load, site_layer

pytestmark = pytest.mark.engine

DECOY_SITE = "usr/local/lib/python3.14/site-packages"   # a python the fixture does not have
PREFIX = f"127.0.0.1:9/dspark-patch-test/hostile-apply-{secrets.token_hex(3)}"


def _config(info: dict) -> dict:
    return {k: v for k, v in info["Config"].items() if v not in (None, "", [], {})}


def _containers_of(image_id: str) -> list[str]:
    done = subprocess.run(["docker", "ps", "-a", "-q", "--filter", f"ancestor={image_id}"],
                          capture_output=True, text=True, check=True)
    return done.stdout.split()


def _exists(ref: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", ref], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The hostile images (name -> tag), and the fixture patched by apply ("patched")."""
    where = tmp_path_factory.mktemp("hostile-apply")
    copy = vllm.tree_copy("0.33.0", where / "copy" / "site-packages")
    fixture = images.fixture_image()
    info = _inspect(fixture)
    lower, config = list(info["RootFS"]["Layers"]), _config(info)
    tags: dict[str, str] = {}
    try:
        patched = tags["patched"] = f"{PREFIX}-patched:1"
        res = run("apply", "--image", fixture, "--tag", patched, "--pull", "never", "--no-probe",
                  "--report-dir", str(where / "apply"))
        assert res.returncode == 0, res.stderr[-800:]
        patched_info = _inspect(patched)
        cases = {
            # an unpatched vLLM in the site folder of a python3.14 the image does not have
            "decoy": [*lower, site_layer(copy, DECOY_SITE)],
            # the same decoy beside the really patched image (it claims the patch in its labels)
            "patched-decoy": [*patched_info["RootFS"]["Layers"], site_layer(copy, DECOY_SITE)],
        }
        for name, layers in cases.items():
            tags[name] = f"{PREFIX}-{name}:1"
            cfg = config if name == "decoy" else _config(patched_info)
            assert _load(layers, tags[name], cfg) is not None, f"the engine refused {name}"
        yield tags
    finally:
        for tag in tags.values():
            subprocess.run(["docker", "rmi", "-f", tag, f"{tag}-out"], capture_output=True, check=False)


def _refused(tag: str, report: Path, *, says: tuple[str, ...]) -> dict:
    """apply on `tag` exits 1 with one line saying `says`; nothing tagged, no container left,
    the source image's id unchanged. Returns the audit report."""
    before = _inspect(tag)["Id"]
    res = run("apply", "--image", tag, "--tag", f"{tag}-out", "--pull", "never", "--no-probe",
              "--report-dir", str(report))
    line = res.assert_clean_error(1)
    for text in says:
        assert text in line, line
    assert not _exists(f"{tag}-out")
    assert _inspect(tag)["Id"] == before
    assert _containers_of(before) == []
    audit = json.loads((report / "audit.json").read_text())
    assert audit["status"] == "failed" and audit["result_image"] is None
    return audit


# --- class 3: a decoy site folder ----------------------------------------------------------------
def test_apply_refuses_an_image_with_a_vllm_no_interpreter_imports(made: dict[str, str], tmp_path: Path) -> None:
    audit = _refused(made["decoy"], tmp_path / "a", says=(f"/{DECOY_SITE}/vllm", "no interpreter of the image imports",
                                                          f"/{SITE}", "nothing was written"))
    assert audit["errors"][0]["kind"] == "unimported-copy"
    steps = [s["name"] for s in audit["steps"]]
    assert "write" not in steps and "integrity" not in steps, steps  # refused before the base check, before writing


def test_verify_fails_a_patched_image_beside_a_decoy(made: dict[str, str], tmp_path: Path) -> None:
    # The patched image alone verifies; the same image with the decoy beside it does not.
    ok = run("verify", "--image", made["patched"], "--pull", "never", "--no-probe", "--report-dir", str(tmp_path / "ok"))
    assert ok.returncode == 0, ok.stderr[-800:]
    res = run("verify", "--image", made["patched-decoy"], "--pull", "never", "--no-probe",
              "--report-dir", str(tmp_path / "v"))
    line = res.assert_clean_error(1)
    assert f"/{DECOY_SITE}/vllm" in line and "no interpreter of the image imports" in line, line
    assert "OK: verified" not in res.stdout + res.stderr
    # and apply refuses it too, rather than calling it already applied and tagging it
    _refused(made["patched-decoy"], tmp_path / "a", says=(f"/{DECOY_SITE}/vllm",))


def test_a_vllm_of_a_second_real_interpreter_is_no_decoy(tmp_path: Path) -> None:
    # two-pythons: python3 on PATH has no vLLM, /opt/vllm-env's interpreter imports it
    image = images.two_pythons_image()
    out = f"{PREFIX}-two-pythons:1"
    try:
        res = run("apply", "--image", image, "--tag", out, "--pull", "never", "--no-probe", "--report-dir", str(tmp_path))
        assert res.returncode == 0, res.stderr[-800:]
        assert _exists(out)
    finally:
        subprocess.run(["docker", "rmi", "-f", out], capture_output=True, check=False)
