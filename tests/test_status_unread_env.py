"""Configuration nothing reads, on the real engine: the 0.34.0 fixture with the DSpark flag left in
its Env, as a team's image keeps it after the upgrade (0.34.0 has the change upstream, no flag).

`status` (container and layers routes, and the registry route) and `verify` (engine and registry)
name the variable in the run's notes; the exit code is the one the same image without the
variable gets: a note is never a finding.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from dspark_patch.report.status_render import load_status_schema
from tests.support.cli import run
from tests.support.images import fixture_034_image
from tests.support.registry import loopback_registry, put_image

pytestmark = pytest.mark.engine

FLAG = "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER"
NOTE = (f"{FLAG} is set in the image's Env but vllm 0.34.0 does not read it (introduced by dspark-skip-mtp-buffer): "
        "remove it")


@pytest.fixture(scope="module")
def flagged(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The 0.34.0 fixture with `ENV FLAG=1` in one more (empty) layer; removed afterwards."""
    context = tmp_path_factory.mktemp("flagged")
    (context / "Dockerfile").write_text(f"FROM {fixture_034_image()}\nENV {FLAG}=1\n")
    tag = f"dspark-patch/test-result:unread-env-{uuid.uuid4().hex[:8]}"
    subprocess.run(["docker", "build", "--quiet", "--network", "none", "-t", tag, str(context)], check=True,
                   capture_output=True, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    try:
        yield tag
    finally:
        subprocess.run(["docker", "rmi", "--force", tag], check=False, capture_output=True)


def _notes(res) -> list[str]:
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    return list(res.json.get("notes", ()))


@pytest.mark.parametrize("via", ["container", "layers"])
def test_status_names_the_flag_nothing_reads(flagged: str, via: str) -> None:
    plain = run("status", "--image", fixture_034_image(), "--via", via, "--json")
    res = run("status", "--image", flagged, "--via", via, "--json")
    assert f"{flagged}: {NOTE}" in _notes(res)
    jsonschema.Draft202012Validator(load_status_schema(), format_checker=jsonschema.FormatChecker()).validate(res.json)
    assert not any(FLAG in n for n in _notes(plain))
    assert res.returncode == plain.returncode, res.stderr[-2000:]
    row = res.json["images"][0]
    assert row["release"] == "0.34.0" and row["error"] is None
    human = run("status", "--image", flagged, "--via", via)
    assert f"note: {flagged}: {NOTE}" in " ".join(human.stdout.split())


def test_verify_names_it_and_fails_as_it_would_without_it(flagged: str, tmp_path: Path) -> None:
    plain = run("verify", "--image", fixture_034_image(), "--no-probe", "--json", "--report-dir", str(tmp_path / "a"))
    res = run("verify", "--image", flagged, "--no-probe", "--json", "--report-dir", str(tmp_path / "b"))
    assert NOTE in _notes(res) and not any(FLAG in n for n in _notes(plain))
    assert (res.returncode, res.json["status"]) == (plain.returncode, plain.json["status"])


@pytest.mark.registry
def test_the_registry_routes_name_it_too(flagged: str, tmp_path: Path) -> None:
    with loopback_registry(tmp_path / "registry") as host:
        remote = f"{host}/team/vllm:0.34.0-flagged"
        put_image(flagged, remote)
        env = {"DOCKER_HOST": "tcp://127.0.0.1:9", "DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
        res = run("status", "--image", remote, "--via", "registry", "--json", env=env)
        assert f"{remote}: {NOTE}" in _notes(res)
        assert res.json["images"][0]["release"] == "0.34.0"
        res = run("verify", "--image", remote, "--via", "registry", "--json", "--report-dir", str(tmp_path / "v"),
                  env=env)
        assert NOTE in _notes(res)
