"""Odd but valid image configs (docs/status.md: odd but valid configs) are patched with every field kept.

The OCI image spec makes `created` (of the image and of each history entry), `history` and
`config` optional; reproducible-build tools leave `created` out. Each source here is the real
fixture's layers under a config the test writes, loaded as a `docker load` archive under a
test-owned tag (the layers are already on the engine, which takes them by diff_id, so the
archive carries empty layer files, as the tool's own append does). Then the real CLI runs
`apply --image`, `verify --image` and `status --image` on the result.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import uuid
from collections.abc import Callable
from typing import Any

import docker
import pytest

from dspark_patch.pipeline import LABEL_PREFIX
from dspark_patch.targets.docker import CONFIG_FIELDS
from tests.support.cli import run
from tests.support.images import fixture_image

pytestmark = pytest.mark.engine

# Go's zero time, which the engine's history call reports for an entry without `created`.
NO_CREATED = -62135596800


@pytest.fixture(scope="module")
def client() -> docker.DockerClient:
    return docker.from_env()


@pytest.fixture(scope="module")
def fixture_attrs(client) -> dict[str, Any]:
    return client.images.get(fixture_image()).attrs


def _no_created(base: dict[str, Any], attrs: dict[str, Any]) -> dict[str, Any]:
    steps = [{"created_by": f"layer {n}"} for n in range(len(attrs["RootFS"]["Layers"]))]
    return {**base, "config": attrs["Config"], "history": steps}


def _no_history(base: dict[str, Any], attrs: dict[str, Any]) -> dict[str, Any]:
    return {**base, "created": "2026-01-02T03:04:05Z", "config": attrs["Config"]}


def _empty_env(base: dict[str, Any], attrs: dict[str, Any]) -> dict[str, Any]:
    steps = [{"created": "2026-01-02T03:04:05Z", "created_by": f"layer {n}"} for n in range(len(attrs["RootFS"]["Layers"]))]
    return {**base, "created": "2026-01-02T03:04:05Z", "config": {**attrs["Config"], "Env": []}, "history": steps}


def _no_config(base: dict[str, Any], attrs: dict[str, Any]) -> dict[str, Any]:
    return dict(base)


SHAPES: dict[str, Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]]] = {
    "no-created": _no_created, "no-history": _no_history, "empty-env": _empty_env, "no-config": _no_config,
}


def _load(config: dict[str, Any], tag: str) -> None:
    """`docker load` an archive holding `config` over the fixture's layers, tagged `tag`."""
    blob = json.dumps(config).encode()
    name = hashlib.sha256(blob).hexdigest() + ".json"
    layers = [f"{d.split(':', 1)[1]}/layer.tar" for d in config["rootfs"]["diff_ids"]]
    manifest = [{"Config": name, "RepoTags": [tag], "Layers": layers}]
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w:") as tar:
        for member, data in [(name, blob), *((layer, b"") for layer in layers),
                             ("manifest.json", json.dumps(manifest).encode())]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    docker.from_env().images.load(archive.getvalue())


@pytest.fixture(params=sorted(SHAPES))
def odd(request, client, fixture_attrs):
    """(shape, source tag, result tag); both tags are removed afterwards."""
    shape = request.param
    base = {"architecture": fixture_attrs["Architecture"], "os": fixture_attrs["Os"],
            "rootfs": {"type": "layers", "diff_ids": fixture_attrs["RootFS"]["Layers"]}}
    config = SHAPES[shape](base, fixture_attrs)
    stem = f"dspark-patch-test/odd-config:{shape}-{uuid.uuid4().hex[:8]}"
    _load(config, stem)
    yield shape, stem, f"{stem}-patched"
    for tag in (f"{stem}-patched", stem):
        try:
            client.images.remove(tag, force=True)
        except docker.errors.ImageNotFound:
            pass


def _unset(value: Any) -> Any:
    # The engine inspects a missing config as null, and one holding only labels as `User: ""`.
    return None if value in (None, "", [], {}) else value


def test_an_odd_but_valid_config_is_patched_with_its_fields_kept_and_verifies(odd, client, tmp_path):
    shape, source, result = odd
    before = client.images.get(source).attrs
    history_before = client.api.history(source)

    applied = run("apply", "--image", source, "--tag", result, "--pull", "never", "--json",
                  "--report-dir", str(tmp_path / "apply"))
    assert applied.returncode == 0, applied.stderr
    assert applied.json["status"] == "applied"

    after = client.images.get(result).attrs
    # every config field as the source had it (the engine's zero value for an absent one)
    for field in CONFIG_FIELDS:
        if field != "Labels":
            assert _unset((after["Config"] or {}).get(field)) == _unset((before["Config"] or {}).get(field)), field
    labels = (after["Config"] or {}).get("Labels") or {}
    assert {k: v for k, v in labels.items() if not k.startswith(LABEL_PREFIX)} == ((before["Config"] or {}).get("Labels") or {})
    assert labels[f"{LABEL_PREFIX}.patch.id"] == "dspark-skip-mtp-buffer"
    assert after["RootFS"]["Layers"][:-1] == before["RootFS"]["Layers"]
    assert len(after["RootFS"]["Layers"]) == len(before["RootFS"]["Layers"]) + 1
    assert after["Architecture"] == before["Architecture"] and after["Os"] == before["Os"]
    # the source's history entries kept, `created` absent where it was absent (never year 1
    # written as a date), and one entry for the new layer, made now, where there is history
    history_after = client.api.history(result)
    if not history_before:  # no-history, no-config
        assert history_after == []
    else:
        assert [(h["CreatedBy"], h["Created"]) for h in history_after[1:]] == [
            (h["CreatedBy"], h["Created"]) for h in history_before]
        assert history_after[0]["CreatedBy"].startswith("dspark-patch:")
        assert history_after[0]["Created"] > 0
    if shape == "no-created":
        assert {h["Created"] for h in history_before} == {NO_CREATED}
    assert not after["Created"].startswith("0001")

    verified = run("verify", "--image", result, "--pull", "never", "--json", "--report-dir", str(tmp_path / "verify"))
    assert verified.returncode == 0, verified.stderr
    assert verified.json["status"] == "verified" and verified.json["probe"]["ok"]

    status = run("status", "--image", result, "--json")
    assert status.returncode == 0, status.stderr
    assert status.json["images"][0]["patch_sets"]["dspark-skip-mtp-buffer"] == "applied"
    # the source is untouched
    assert client.images.get(source).attrs["Id"] == before["Id"]
