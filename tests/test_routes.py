"""Every report says which route judged the image, and why (dspark_patch/routing.py).

The table itself first (fast: pure, nothing asked that a row does not need), then through the
CLI on the real engine and a real loopback registry: verify in a container of an engine image,
status through the engine's save (`--via layers`), verify and status from the registry (asked,
and `--via auto` with no engine), and status's silent fallback to the registry for an image the
engine lacks. Each asserts what a user reads: audit.json's `route`, the line in audit.md, the
closing summary's row, the status row's `route` and the table's reason line.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from dspark_patch import routing
from dspark_patch.errors import BadInput, EngineUnreachable
from dspark_patch.report.audit_json import load_schema
from dspark_patch.report.status_render import load_status_schema
from tests.support.cli import run
from tests.support.images import fixture_034_image
from tests.support.registry import loopback_registry, put_image

NO_ENGINE = {"DOCKER_HOST": "tcp://127.0.0.1:9"}


def _never() -> bool:
    raise AssertionError("a fact no row needed was asked")


def _verify(via: str, **given):
    no_engine = given.pop("no_engine", lambda: None)
    args = {"image": "reg.example:5000/team/vllm:1", "root": None, "python": None, "platform": None, "pull": "missing",
            "strip": None, **given}
    return routing.verify_route(via, no_engine=no_engine, **args)


def test_verify_reads_the_registry_only_when_asked_or_no_engine_answers() -> None:
    route, error = _verify("registry", no_engine=_never)
    assert route is not None and route.name == "registry" and error is None
    assert route.reason.startswith("asked with --via registry")
    assert _verify("engine", no_engine=_never) == (None, None)
    assert _verify("auto") == (None, None)                       # an engine answers: resolve.py decides
    down = EngineUnreachable("cannot reach the engine")
    route, error = _verify("auto", no_engine=lambda: down)
    assert route is not None and route.name == "registry" and error is down
    assert route.reason == ("no engine answered at $DOCKER_HOST, and reg.example:5000/team/vllm:1 names its registry "
                            "reg.example:5000: its layers read from there, nothing run (--via auto)")
    # a Docker Hub name names no registry: the engine's error stands, and the engine is not asked here
    assert _verify("auto", image="vllm/vllm-openai:v0.10.1", no_engine=_never) == (None, None)
    with pytest.raises(BadInput, match="--platform is for the engine's verify"):
        _verify("registry", platform="linux/amd64")


def test_status_names_auto_s_choice_and_asks_the_cache_only_for_one_image() -> None:
    assert routing.status_engine("layers", platform=None, images=1, all_cached=_never).reason.startswith(
        "asked with --via layers")
    assert routing.status_engine("container", platform=None, images=3, all_cached=_never).name == "container"
    assert routing.status_engine("auto", platform="linux/arm64", images=3, all_cached=_never).name == "container"
    several = routing.status_engine("auto", platform=None, images=2, all_cached=_never)
    assert (several.name, several.reason.split(":")[0]) == ("layers", "auto, several images")
    cached = routing.status_engine("auto", platform=None, images=1, all_cached=lambda: True)
    assert cached.name == "layers" and "scan cache" in cached.reason
    assert routing.status_engine("auto", platform=None, images=1, all_cached=lambda: False).name == "container"
    assert routing.status_absent("auto", "never", "r:5000/a:1") == routing.Route(
        name="registry", reason="the engine has no image named r:5000/a:1: read from its registry (--via auto)")
    assert routing.status_absent("auto", "missing", "r:5000/a:1") is None      # the engine pulls it
    assert routing.status_absent("container", "never", "r:5000/a:1") is None
    assert routing.status_without_engine("auto", ["r:5000/a:1", "vllm/vllm-openai:v1"]) is None
    assert routing.status_without_engine("auto", ["r:5000/a:1"]).name == "registry"  # type: ignore[union-attr]


def test_a_folder_s_row_names_the_local_route(tmp_path: Path) -> None:
    res = run("status", "--root", str(tmp_path), "--json")
    (row,) = res.json["images"]
    assert row["route"] == {"name": "local", "reason": "a folder named with --root: its files read in place"}
    jsonschema.Draft202012Validator(load_status_schema()).validate(res.json)


def test_verify_of_an_attestation_names_the_registry_even_when_refused(tmp_path: Path) -> None:
    res = run("verify", "--attestation", "--key", str(tmp_path / "absent.pem"), "--image", "reg.example:5000/a:1",
              "--report-dir", str(tmp_path / "v"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    doc, page = _audit(tmp_path / "v")
    assert doc["route"]["name"] == "registry"
    assert doc["route"]["reason"].startswith("asked with --attestation: the signed attestation attached to the image")
    assert "Route: `registry` — asked with --attestation" in page


def _audit(folder: Path) -> tuple[dict, str]:
    import json

    doc = json.loads((folder / "audit.json").read_text())
    jsonschema.Draft202012Validator(load_schema()).validate(doc)
    return doc, (folder / "audit.md").read_text()


@pytest.mark.engine
def test_verify_of_an_engine_image_names_its_container_and_the_case(tmp_path: Path) -> None:
    image = fixture_034_image()
    res = run("verify", "--image", image, "--no-probe", "--report-dir", str(tmp_path / "v"))
    assert "Traceback" not in res.stderr
    doc, page = _audit(tmp_path / "v")
    reason = "a container of the image on the engine (an image id, or a name with no registry host)"
    assert doc["route"] == {"name": "container", "reason": reason}
    assert f"Route: `container` — {reason}." in page
    assert f"container: {reason}" in " ".join(res.stderr.split())   # the closing summary's route row


@pytest.mark.engine
def test_status_names_the_engine_route_asked_and_auto_s(tmp_path: Path) -> None:
    image = fixture_034_image()
    layers = run("status", "--image", image, "--via", "layers", "--json", "--report-dir", str(tmp_path / "s"))
    (row,) = layers.json["images"]
    assert row["route"]["name"] == "layers"
    assert row["route"]["reason"].startswith("asked with --via layers: one save of the images' layers")
    assert "| route |" in (tmp_path / "s" / "status.md").read_text()
    table = run("status", "--image", image, "--via", "container")
    assert "route container (1 row(s)): asked with --via container" in " ".join(table.stdout.split())


@pytest.mark.engine
@pytest.mark.registry
def test_the_registry_routes_name_themselves_and_the_fallbacks_say_why(tmp_path: Path) -> None:
    with loopback_registry(tmp_path / "registry") as host:
        remote = f"{host}/team/vllm:0.34.0-route"
        put_image(fixture_034_image(), remote)     # in the registry only: the engine has no such name
        cache = {"DSPARK_PATCH_CACHE": str(tmp_path / "cache")}

        # status, auto, engine up: the engine lacks the name, so its registry reads it, and the row says so
        fell = run("status", "--image", remote, "--json", env=cache)
        (row,) = fell.json["images"]
        assert row["error"] is None and row["release"] == "0.34.0"
        assert row["route"] == {"name": "registry",
                                "reason": f"the engine has no image named {remote}: read from its registry (--via auto)"}
        table = run("status", "--image", remote, env=cache)
        assert f"route registry (1 row(s)): the engine has no image named {remote}" in " ".join(table.stdout.split())

        asked = run("status", "--image", remote, "--via", "registry", "--json", env={**NO_ENGINE, **cache})
        assert asked.json["images"][0]["route"]["reason"].startswith("asked with --via registry")

        # verify: asked, then auto with no engine answering
        run("verify", "--image", remote, "--via", "registry", "--report-dir", str(tmp_path / "asked"),
            env={**NO_ENGINE, **cache})
        doc, page = _audit(tmp_path / "asked")
        assert doc["route"]["name"] == "registry" and doc["route"]["reason"].startswith("asked with --via registry")
        assert "Route: `registry` — asked with --via registry" in page
        run("verify", "--image", remote, "--report-dir", str(tmp_path / "auto"), env={**NO_ENGINE, **cache})
        doc, _ = _audit(tmp_path / "auto")
        assert doc["route"] == {"name": "registry", "reason": (
            f"no engine answered at $DOCKER_HOST, and {remote} names its registry {host}: its layers read from "
            "there, nothing run (--via auto)")}
