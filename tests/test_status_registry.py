"""`status --via registry` on a real loopback registry behind a login, with no engine to ask.

The images are the engine fleet of tests/test_status.py (the fixture, its patched result, a hand
edit, an added module and `.pth`) pushed with `docker push`, and the amd64+arm64 fixture index.
Each is read twice: by the engine route from the engine's copy, and by the registry route with
DOCKER_HOST pointing at nothing; the rows must be equal, field by field, but for the reference.
The registry's access log counts the blobs a run fetched: a warm cache fetches no layer.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.support import images
from tests.support.cli import run
from tests.support.registry import login_registry_in, push_only_to_registry
from tests.test_status import PATCH_ID, fleet

pytestmark = [pytest.mark.engine, pytest.mark.registry]
__all__ = ["fleet"]  # the engine fleet, shared with tests/test_status.py

USER, PASSWORD = "auditor", "s3cret-for-tests"
NO_ENGINE = "tcp://127.0.0.1:9"
KINDS = ("fixture", "patched", "edited", "elsewhere", "added")


@pytest.fixture(scope="module")
def login_registry(tmp_path_factory):
    """A loopback registry asking for a login, a DOCKER_CONFIG holding it, and its log file."""
    with login_registry_in(tmp_path_factory.mktemp("status-registry"), USER, PASSWORD) as reg:
        yield reg


@pytest.fixture(scope="module")
def pushed(fleet: dict[str, str], login_registry) -> dict[str, str]:
    """The fleet in the registry (and only there under these names)."""
    address, config, _ = login_registry
    remote = {}
    for kind in KINDS:
        target = f"{address}/team/vllm:{kind}"
        push_only_to_registry(fleet[kind], target, config)
        remote[kind] = target
    return remote


def _status(*args: str, env: dict[str, str]) -> tuple[int, list[dict], str]:
    res = run("status", "--json", *args, env=env)
    assert "Traceback" not in res.stderr, res.stderr
    return res.returncode, json.loads(res.stdout)["images"], res.stderr


def _blob_gets(log: Path, since: int) -> list[str]:
    """The blob digests served (GET, 200) since byte `since` of the registry's access log (a
    request the registry first answers 401, before the login is sent, is not a fetch)."""
    text = log.read_bytes()[since:].decode("utf-8", "replace")
    return re.findall(r'"GET /v2/[^ ]+/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" 200 ', text)


def _same(row: dict) -> dict:
    return {k: v for k, v in row.items() if k != "ref"}


def test_the_registry_route_gives_the_engine_routes_rows_with_no_engine_and_a_warm_cache_fetches_no_layer(
        fleet: dict[str, str], pushed: dict[str, str], login_registry, tmp_path: Path) -> None:
    address, config, log = login_registry
    code, engine_rows, _ = _status(*(a for k in KINDS for a in ("--image", fleet[k])), "--via", "layers", env={})
    assert code == 1 and [r["error"] for r in engine_rows] == [None] * len(KINDS)

    env = {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(config), "DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    start = log.stat().st_size
    code_r, registry_rows, _ = _status(*(a for k in KINDS for a in ("--image", pushed[k])), "--via", "registry", env=env)
    assert code_r == code
    assert [r["ref"] for r in registry_rows] == [pushed[k] for k in KINDS]
    # Row by row: the same states, the same lists, the same release, site folder, id and platform.
    for kind, by_engine, by_registry in zip(KINDS, engine_rows, registry_rows, strict=True):
        assert _same(by_registry) == _same(by_engine), kind
    states = {k: r["patch_sets"][PATCH_ID] for k, r in zip(KINDS, registry_rows, strict=True)}
    assert states == {"fixture": "absent", "patched": "applied", "edited": "drifted", "elsewhere": "absent",
                      "added": "absent"}
    assert registry_rows[4]["added"] == ["vllm/extra_hook.py", "zz-hook.pth"]
    first = _blob_gets(log, start)
    # Every layer the five tags share was fetched once: no blob twice.
    assert first and len(first) == len(set(first)), first

    # auto with no engine answering reads the registry too; the warm cache fetches no layer.
    start = log.stat().st_size
    code_a, again, _ = _status(*(a for k in KINDS for a in ("--image", pushed[k])), env=env)
    assert code_a == code and [_same(r) for r in again] == [_same(r) for r in registry_rows]
    configs = {r["id"] for r in registry_rows}
    assert set(_blob_gets(log, start)) <= configs, "a layer was fetched again with a warm cache"
    entries = list((tmp_path / "cache").rglob("*.scan"))
    assert entries and sum(p.stat().st_size for p in entries) < 64 << 20  # scans, not layers
    # Nothing else was written: the cache folder holds only its entries.
    assert all(p.suffix == ".scan" for p in (tmp_path / "cache").rglob("*") if p.is_file())


def test_without_a_login_the_registry_route_is_one_clean_line_per_image(pushed: dict[str, str], tmp_path: Path) -> None:
    env = {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(tmp_path / "empty"), "DSPARK_PATCH_CACHE": str(tmp_path / "c")}
    code, rows, _ = _status("--image", pushed["patched"], "--via", "registry", env=env)
    assert code == 3 and "docker login" in rows[0]["error"] and not rows[0]["patch_sets"]


@contextmanager
def _docker_config(config: Path) -> Iterator[None]:
    before = os.environ.get("DOCKER_CONFIG")
    os.environ["DOCKER_CONFIG"] = str(config)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("DOCKER_CONFIG", None)
        else:
            os.environ["DOCKER_CONFIG"] = before


@pytest.mark.emulation  # the arm64 fixture (scripts/build-arm64-fixture); nothing of it runs
def test_an_index_gives_one_row_per_platform_equal_to_the_engine_route(login_registry, tmp_path: Path) -> None:
    from tests.support.index import arm64_fixture_image, publish_index

    address, config, _ = login_registry
    with _docker_config(config):
        index = publish_index(address, repository="team/vllm-multi")
    local = {"linux/amd64": images.fixture_image(), "linux/arm64/v8": arm64_fixture_image()}
    env = {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(config), "DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    code, rows, _ = _status("--image", index.ref, "--via", "registry", env=env)
    assert [r["ref"] for r in rows] == [index.ref, index.ref]
    platforms = [r["platform"] for r in rows]
    assert platforms[0] == "linux/amd64" and platforms[1].startswith("linux/arm64"), platforms
    for row, engine_ref in zip(rows, local.values(), strict=True):
        _, (by_engine,), _ = _status("--image", engine_ref, "--via", "layers", env={})
        assert _same(row) == _same(by_engine), row["platform"]
    _, only, _ = _status("--image", index.ref, "--via", "registry", "--platform", "linux/arm64", env=env)
    assert [_same(r) for r in only] == [_same(rows[1])]
    subprocess.run(["docker", "rmi", f"{address}/team/vllm-multi:0.33.0-amd64"], capture_output=True, check=False)


def _events(since: str, until: str, kind: str) -> list[str]:
    out = subprocess.run(["docker", "events", "--since", since, "--until", until, "--filter", f"type={kind}",
                          "--format", "{{.Action}} {{.Actor.ID}} {{.From}}"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_a_warm_cache_reads_no_layer_from_the_engine_and_says_the_same(fleet: dict[str, str], tmp_path: Path) -> None:
    import time

    env = {"DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    refs = [a for k in ("patched", "edited", "added") for a in ("--image", fleet[k])]
    code, cold, _ = _status(*refs, "--via", "layers", env=env)
    assert code == 1 and [r["error"] for r in cold] == [None, None, None]
    since = str(int(time.time()))
    time.sleep(1)
    code_w, warm, _ = _status(*refs, "--via", "layers", env=env)
    _, one, _ = _status("--image", fleet["edited"], env=env)  # auto, one image, all its layers cached
    time.sleep(1)
    until = str(int(time.time()) + 1)
    assert code_w == code and warm == cold and one == [cold[1]]
    ids = {r["id"] for r in cold} | {r["id"].removeprefix("sha256:") for r in cold} | {r["ref"] for r in cold}
    # No `docker save` and no container: the engine was only asked for the images' inspect.
    assert not [e for e in _events(since, until, "image") if e.split()[0] == "save" and any(i in e for i in ids)]
    assert not [e for e in _events(since, until, "container") if any(i in e for i in ids)]
