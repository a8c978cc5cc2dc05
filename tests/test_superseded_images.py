"""A release that ships the change (vLLM 0.34.0), as images of both shapes teams run: the pip
fixture and the official shape (uv, no bytecode, USER 2000). status says `superseded` (exit 0),
apply writes no layer and names nothing, verify passes with the note; a series of the DSpark set
and a team set that still applies gives one layer holding only the team set."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import docker
import pytest

from tests.support.cli import run
from tests.support.images import fixture_034_image, official_034_image
from tests.support.team_sets import write_set
from tests.support.vllm import installed_tree

pytestmark = pytest.mark.engine

DSPARK = "dspark-skip-mtp-buffer"
SHAPES = [pytest.param(fixture_034_image, id="pip"), pytest.param(official_034_image, id="official")]


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    return docker.from_env()


@pytest.mark.parametrize("source", SHAPES)
def test_status_apply_verify_on_the_release_image(client, source: Callable[[], str], tmp_path: Path) -> None:
    image = source()
    before = client.images.get(image).attrs
    res = run("status", "--image", image, "--pull", "never", "--json")
    assert res.returncode == 0, (res.stdout, res.stderr)
    (row,) = res.json["images"]
    assert row["patch_sets"][DSPARK] == "superseded" and row["unexplained"] == [] and row["reference"]

    tag = f"dspark-patch/test-superseded:{uuid.uuid4().hex[:10]}"
    res = run("apply", "--image", image, "--pull", "never", "--tag", tag, "--json", "--report-dir", str(tmp_path / "a"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    doc = res.json
    assert doc["status"] == "already-applied" and doc["result_image"] is None and doc["layer"] is None
    assert [s["record"] for s in doc["superseded"]] == ["vllm-0.34.0"]
    assert doc["probe"]["ran"] and all(c["ok"] for c in doc["probe"]["cases"])
    assert "a container of" in doc["probe"]["ran_in"]
    assert any(n.startswith(f"--tag {tag}: nothing was named") for n in doc["notes"])
    with pytest.raises(docker.errors.ImageNotFound):
        client.images.get(tag)
    after = client.images.get(image).attrs
    assert (after["Id"], after["RootFS"]["Layers"]) == (before["Id"], before["RootFS"]["Layers"])

    res = run("verify", "--image", image, "--pull", "never", "--json", "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 0, (res.stdout, res.stderr)
    assert res.json["status"] == "verified"
    assert any("superseded in vllm 0.34.0" in n for n in res.json["notes"])


def test_a_series_on_the_release_image_is_one_layer_of_the_team_set(client, tmp_path: Path) -> None:
    tree = installed_tree("0.34.0")
    logger = (tree / "vllm/logger.py").read_bytes()
    team = write_set(tmp_path / "team", "team-note", {"vllm/logger.py": (logger, logger + b"\n# team note\n")},
                     release="0.34.0")
    env = {"DSPARK_PATCH_PATH": str(team.parent)}
    image = fixture_034_image()
    tag = f"dspark-patch/test-superseded-series:{uuid.uuid4().hex[:10]}"
    try:
        res = run("apply", "--image", image, "--pull", "never", "--patch", DSPARK, "--patch", "team-note",
                  "--tag", tag, "--json", "--report-dir", str(tmp_path / "a"), env=env)
        assert res.returncode == 0, (res.stdout, res.stderr)
        assert [s["id"] for s in res.json["superseded"]] == [DSPARK]
        source, result = client.images.get(image).attrs, client.images.get(tag).attrs
        assert result["RootFS"]["Layers"][:-1] == source["RootFS"]["Layers"]
        assert len(result["RootFS"]["Layers"]) == len(source["RootFS"]["Layers"]) + 1
        sources = [c["path"] for c in res.json["layer"]["changes"] if c["path"].endswith(".py")]
        assert len(sources) == 1 and sources[0].endswith("/vllm/logger.py"), res.json["layer"]["changes"]
        assert not any("deepseek_v4" in c["path"] or "envs." in c["path"] for c in res.json["layer"]["changes"])
        labels = result["Config"]["Labels"]
        assert set(json.loads(labels["io.github.dspark-patch.files"])) == {"vllm/logger.py"}
        ok = run("verify", "--image", tag, "--pull", "never", "--patch", DSPARK, "--patch", "team-note",
                 "--report-dir", str(tmp_path / "v"), env=env)
        assert ok.returncode == 0, (ok.stdout, ok.stderr)
    finally:
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass


@pytest.fixture(scope="module")
def release_in_registry(tmp_path_factory) -> Iterator[str]:
    """The official-shape 0.34.0 image in a loopback registry (and only there under that name)."""
    from tests.support.registry import loopback_registry, put_image

    with loopback_registry(tmp_path_factory.mktemp("superseded-registry")) as address:
        target = f"{address}/team/vllm:0.34.0"
        put_image(official_034_image(), target)
        yield target


@pytest.mark.registry
def test_status_and_verify_via_registry_say_superseded_with_no_engine(release_in_registry: str,
                                                                      tmp_path: Path) -> None:
    no_engine = {"DOCKER_HOST": "tcp://127.0.0.1:9", "DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    res = run("status", "--image", release_in_registry, "--via", "registry", "--json", env=no_engine)
    assert res.returncode == 0, (res.stdout, res.stderr)
    (row,) = res.json["images"]
    assert row["patch_sets"][DSPARK] == "superseded" and row["unexplained"] == []
    res = run("verify", "--image", release_in_registry, "--via", "registry", "--json",
              "--report-dir", str(tmp_path / "v"), env=no_engine)
    assert res.returncode == 0, (res.stdout, res.stderr)
    doc = res.json
    assert doc["status"] == "verified"
    assert any("superseded in vllm 0.34.0" in n and "verify --image" in n for n in doc["notes"])
    assert {s["name"]: s["status"] for s in doc["steps"]}["probe"] == "skipped"


@pytest.mark.registry
def test_every_platform_of_the_release_index_is_superseded(tmp_path: Path) -> None:
    """The official-shape 0.34.0 as an amd64+arm64 index, read from its registry (nothing runs,
    so the arm64 image needs no emulation): both rows `superseded`, exit 0."""
    from tests.support.index import arm64_official_034_image, publish_index
    from tests.support.registry import loopback_registry

    with loopback_registry(tmp_path / "registry") as host:
        index = publish_index(host, repository="vllm/vllm-openai", tag="0.34.0",
                              sources=(official_034_image(), arm64_official_034_image()))
        res = run("status", "--image", index.ref, "--via", "registry", "--platform", "all", "--json",
                  env={"DOCKER_HOST": "tcp://127.0.0.1:9", "DSPARK_PATCH_CACHE": str(tmp_path / "cache")})
    assert res.returncode == 0, (res.stdout, res.stderr)
    rows = res.json["images"]
    assert sorted(r["platform"].split("/")[1] for r in rows) == ["amd64", "arm64"]
    assert all(r["patch_sets"][DSPARK] == "superseded" and r["unexplained"] == [] and r["reference"] for r in rows)
