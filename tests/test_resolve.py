"""What a request's target resolves to (pipeline/resolve.py): one case table, one store per run.

Each row of the table is reached here with real parts where they are cheap: a folder for a local
tree, a loopback server speaking the distribution API for the registry (tests/support/
fake_registry.py: it counts the requests, so "nothing was read" is checked too). The engine's
only answer the table asks (does it have the name?) comes from a stand-in store, so the rows
run without an engine; the one line for a name neither on the engine nor in its registry is also
run through the CLI on a real engine (marked `engine`).
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from dspark_patch.errors import BadInput, EngineUnreachable, TargetNotFound
from dspark_patch.pipeline.requests import ImageSpec, LocalSpec, TargetSpec
from dspark_patch.pipeline.resolve import CASES, ImageSource, IndexSource, LocalSource, RunStore, Source, resolve
from dspark_patch.pipeline.runlog import RunLog
from dspark_patch.registry.index import DOCKER_MANIFEST, OCI_INDEX, BadManifest, digest_of
from dspark_patch.report.model import TargetReport
from tests.support.cli import run
from tests.support.fake_registry import fake_registry

ROOT = Path(__file__).resolve().parents[1]
CONFIG = "sha256:" + "c" * 64
IMAGE = json.dumps({"schemaVersion": 2, "mediaType": DOCKER_MANIFEST,
                    "config": {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": CONFIG,
                               "size": 2}, "layers": []}).encode()
IMAGE_DIGEST = digest_of(IMAGE)
INDEX = json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": [
    {"mediaType": DOCKER_MANIFEST, "digest": IMAGE_DIGEST, "size": len(IMAGE),
     "platform": {"os": "linux", "architecture": arch}} for arch in ("amd64", "arm64")]}).encode()


class _Engine:
    """Stands in for the engine: the table only asks whether it has a name."""

    host = "unix:///stand-in"

    def __init__(self, has: bool) -> None:
        self.has = has
        self.asked: list[str] = []

    def tag_exists(self, name: str) -> bool:
        self.asked.append(name)
        return self.has


class _Opener:
    """What RunStore opens: the stand-in, or EngineUnreachable; counts how often it was opened."""

    def __init__(self, engine: _Engine | None) -> None:
        self.engine = engine
        self.opened = 0

    def __call__(self) -> _Engine:
        self.opened += 1
        if self.engine is None:
            raise EngineUnreachable("cannot reach a Docker engine at unix:///nonexistent", hint="point DOCKER_HOST at one")
        return self.engine


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, list[str]]]:
    """A loopback registry: an index of two platforms, one image (by tag and digest), a broken index."""
    bodies = {
        "app/manifests/index": (OCI_INDEX, INDEX),
        "app/manifests/image": (DOCKER_MANIFEST, IMAGE),
        f"app/manifests/{IMAGE_DIGEST}": (DOCKER_MANIFEST, IMAGE),
        "app/manifests/broken": (OCI_INDEX, json.dumps({"schemaVersion": 2, "manifests": [{"size": 1}]}).encode()),
    }
    with fake_registry(bodies) as (host, seen):
        yield host, seen


def _resolve(spec: TargetSpec, engine: _Engine | None = None) -> tuple[Source, _Opener, RunLog]:
    opener = _Opener(engine)
    log = RunLog.start("verify", TargetReport(kind="image", ref="x"), None)
    return resolve(spec, log, RunStore(opener)), opener, log  # type: ignore[arg-type]


def _manifest_reads(seen: list[str]) -> int:
    return len([r for r in seen if "/manifests/" in r])


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- each row of the table ---------------------------------------------------------------------
def test_a_local_tree_opens_no_store(tmp_path):
    source, opener, _ = _resolve(LocalSpec(root=str(tmp_path)))
    assert isinstance(source, LocalSource) and source.spec.root == str(tmp_path)
    assert opener.opened == 0


@pytest.mark.parametrize("ref", ["vllm/vllm-openai:v0.10.1", "sha256:" + "a" * 64])
def test_a_docker_hub_name_or_an_image_id_is_the_engines_and_asks_nothing(ref):
    source, opener, _ = _resolve(ImageSpec(ref=ref), _Engine(has=False))
    assert isinstance(source, ImageSource) and source.kind == "engine" and source.note is None
    assert opener.opened == 0  # the store is opened once, later, by the run that opens the target


def test_pull_never_reads_nothing(served):
    host, seen = served
    before = _manifest_reads(seen)
    source, opener, _ = _resolve(ImageSpec(ref=f"{host}/app:index", pull="never"), _Engine(has=False))
    assert isinstance(source, ImageSource) and source.kind == "engine"
    assert opener.opened == 0 and _manifest_reads(seen) == before


def test_pull_missing_of_a_name_the_engine_has_reads_no_registry(served):
    host, seen = served
    before = _manifest_reads(seen)
    engine = _Engine(has=True)
    source, opener, _ = _resolve(ImageSpec(ref=f"{host}/app:index"), engine)
    assert isinstance(source, ImageSource) and source.kind == "engine"
    assert engine.asked == [f"{host}/app:index"] and _manifest_reads(seen) == before


def test_an_engine_that_does_not_answer_is_said_once_by_the_run_that_opens_the_target(served):
    host, seen = served
    before = _manifest_reads(seen)
    source, opener, _ = _resolve(ImageSpec(ref=f"{host}/app:index"), None)
    assert isinstance(source, ImageSource) and source.kind == "engine"
    assert _manifest_reads(seen) == before
    # the store is never opened twice: the open target step gets the same error
    for _ in range(2):
        with pytest.raises(EngineUnreachable):
            source.store()
    assert opener.opened == 1


def test_a_digest_the_engine_lacks_is_checked_then_pulled_by_the_engine(served):
    host, seen = served
    before = _manifest_reads(seen)
    source, _, log = _resolve(ImageSpec(ref=f"{host}/app@{IMAGE_DIGEST}"), _Engine(has=False))
    assert isinstance(source, ImageSource) and source.kind == "registry"
    assert _manifest_reads(seen) == before + 1 and log.steps == []


def test_pull_always_of_an_index_the_engine_has_stays_one_image(served):
    host, _ = served
    source, _, _ = _resolve(ImageSpec(ref=f"{host}/app:index", pull="always"), _Engine(has=True))
    assert isinstance(source, ImageSource) and source.kind == "registry"


def test_a_malformed_index_is_refused_before_the_engine_pulls(served):
    host, _ = served
    with pytest.raises(BadManifest):
        _resolve(ImageSpec(ref=f"{host}/app:broken", pull="always"), _Engine(has=True))
    with pytest.raises(BadManifest):
        _resolve(ImageSpec(ref=f"{host}/app:broken"), _Engine(has=False))


def test_a_tag_the_engine_lacks_that_its_registry_serves_as_an_index_is_an_index(served):
    host, _ = served
    source, opener, log = _resolve(ImageSpec(ref=f"{host}/app:index"), _Engine(has=False))
    assert isinstance(source, IndexSource)
    assert [str(p) for p in source.index.platforms] == ["linux/amd64", "linux/arm64"]
    assert [s.name for s in log.steps] == ["read index"]
    assert opener.opened == 1  # the same store goes on to every platform's run


def test_a_tag_the_engine_lacks_that_its_registry_serves_as_one_image_is_pulled(served):
    host, _ = served
    source, _, _ = _resolve(ImageSpec(ref=f"{host}/app:image"), _Engine(has=False))
    assert isinstance(source, ImageSource) and source.kind == "registry" and source.note is None


def test_a_name_neither_on_the_engine_nor_in_its_registry_is_one_line_exit_2(served):
    """It used to be handed to the engine's pull after the registry had said so."""
    host, _ = served
    with pytest.raises(TargetNotFound) as caught:
        _resolve(ImageSpec(ref=f"{host}/app:absent"), _Engine(has=False))
    assert caught.value.exit_code == 2
    assert caught.value.line() == (f"image {host}/app:absent is neither on the engine nor in its registry {host} "
                                   "(check the name and tag (`docker images`, the registry's catalog))")


def test_a_registry_not_reachable_from_here_is_left_to_the_engine_and_said():
    """It used to be left to the engine silently: the report now says the index was not looked for."""
    host = f"127.0.0.1:{_closed_port()}"
    source, _, _ = _resolve(ImageSpec(ref=f"{host}/app:1"), _Engine(has=False))
    assert isinstance(source, ImageSource) and source.kind == "registry"
    assert source.note is not None
    assert source.note.startswith(f"{host} could not be read from here (")
    assert "not checked for an image index: the engine pulls it as one image" in source.note


def test_a_registry_timeout_that_is_not_seconds_is_refused_not_passed_over(served, monkeypatch):
    """It used to be passed over silently when no --platform was given."""
    host, _ = served
    monkeypatch.setenv("DSPARK_PATCH_REGISTRY_TIMEOUT", "soon")
    with pytest.raises(BadInput, match="DSPARK_PATCH_REGISTRY_TIMEOUT='soon'"):
        _resolve(ImageSpec(ref=f"{host}/app:index"), _Engine(has=False))


# --- --platform: it must be an index ----------------------------------------------------------
def test_platform_of_an_index_is_an_index_whatever_the_engine_has(served):
    host, _ = served
    source, opener, _ = _resolve(ImageSpec(ref=f"{host}/app:index", platform="all"), _Engine(has=True))
    assert isinstance(source, IndexSource)
    assert opener.opened == 0  # the index run opens the store after it names the index


@pytest.mark.parametrize(("ref", "words"), [
    ("vllm/vllm-openai:v0.10.1", "names no registry host"),
    ("{host}/app:image", "is a single-platform image, not an index"),
])
def test_platform_of_anything_but_an_index_is_bad_input(served, ref, words):
    host, _ = served
    with pytest.raises(BadInput, match=words):
        _resolve(ImageSpec(ref=ref.format(host=host), platform="linux/amd64"), _Engine(has=False))


def test_platform_of_a_name_the_registry_lacks_is_its_answer(served):
    host, _ = served
    with pytest.raises(TargetNotFound, match="is not in the registry"):
        _resolve(ImageSpec(ref=f"{host}/app:absent", platform="all"), _Engine(has=False))


# --- the table is the documentation's ---------------------------------------------------------
def test_every_row_of_the_table_is_in_the_design_document():
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    for case in CASES:
        assert f"| {case.when} | `{case.route}` |" in design, case.when


# --- through the CLI ---------------------------------------------------------------------------
def test_without_an_engine_a_registry_name_is_one_line_exit_3(served, tmp_path):
    """verify --via auto with no engine reads the image from its registry instead; an image the
    registry lacks is then the engine's line (exit 3), with the registry's reason after it."""
    host, seen = served
    before = _manifest_reads(seen)
    res = run("verify", "--image", f"{host}/app:absent", "--report-dir", str(tmp_path / "r"),
              env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    line = res.assert_clean_error(3)
    assert "DOCKER_HOST" in line and "nor could the registry be read instead" in line and "app:absent" in line
    assert _manifest_reads(seen) == before + 1   # the registry was asked once, for that manifest
    refused = run("verify", "--image", f"{host}/app:absent", "--via", "engine", "--report-dir", str(tmp_path / "e"),
                  env={"DOCKER_HOST": "unix:///nonexistent/docker.sock"})
    assert "DOCKER_HOST" in refused.assert_clean_error(3)
    assert _manifest_reads(seen) == before + 1   # --via engine: never the registry


@pytest.mark.engine
def test_a_name_neither_on_the_engine_nor_in_its_registry_is_one_line_through_the_cli(served, tmp_path):
    host, seen = served
    ref = f"{host}/app:absent-{uuid.uuid4().hex[:8]}"
    before = _manifest_reads(seen)
    res = run("verify", "--image", ref, "--report-dir", str(tmp_path / "r"))
    line = res.assert_clean_error(2)
    assert f"image {ref} is neither on the engine nor in its registry {host}" in line
    assert _manifest_reads(seen) == before + 1  # read once, here: the engine was not sent to pull it
    audit = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert audit["status"] == "failed" and audit["errors"][0]["kind"] == "target-not-found"


@pytest.mark.engine
@pytest.mark.registry
def test_a_tag_the_engine_lacks_served_as_an_index_runs_through_the_index_loop(tmp_path_factory, tmp_path):
    """The whole route on a real engine and registry, without emulation: the index's amd64 entry is
    the fixture (its arm64 entry names the same image and is never pulled by a default run)."""
    from tests.support.images import fixture_image
    from tests.support.index import publish_index, remove_images_from
    from tests.support.registry import loopback_registry

    with loopback_registry(tmp_path_factory.mktemp("registry")) as host:
        try:
            index = publish_index(host, sources=(fixture_image(), fixture_image()))
            result = run("apply", "--image", index.ref, "--dry-run", "--json", "--report-dir", str(tmp_path / "r"))
            assert result.returncode == 0, result.stderr[-3000:]
            doc = result.json
            assert doc["status"] == "dry-run" and doc["index"]["ref"] == index.ref
            assert doc["index"]["digest"] == index.digest
            assert [p["platform"] for p in doc["platforms"]] == ["linux/amd64"]
            assert [s["name"] for s in doc["steps"]] == ["read index"]
            one = doc["platforms"][0]["report"]
            assert [s["name"] for s in one["steps"]][:2] == ["pull", "open target"]
            assert any("linux/arm64/v8" in note and "--platform all" in note for note in doc["notes"])
        finally:
            remove_images_from(host)
