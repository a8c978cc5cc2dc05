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
    """What two routes must agree on: the row but its ref and its route (each names its own)."""
    return {k: v for k, v in row.items() if k not in ("ref", "route")}


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
    assert code_w == code and warm == cold and [_same(r) for r in one] == [_same(cold[1])]
    assert one[0]["route"] == {"name": "layers", "reason": "auto: every layer of the image is in the scan cache, so "
                                                           "nothing is read but its inspect"}
    ids = {r["id"] for r in cold} | {r["id"].removeprefix("sha256:") for r in cold} | {r["ref"] for r in cold}
    # No `docker save` and no container: the engine was only asked for the images' inspect.
    assert not [e for e in _events(since, until, "image") if e.split()[0] == "save" and any(i in e for i in ids)]
    assert not [e for e in _events(since, until, "container") if any(i in e for i in ids)]


# --- the fleet read concurrently: a pool of connections, its faults -------------------------------
# Refs out of kind order, and one image under two tags (read once, reported under each).
ORDER = ("added", "patched", "fixture", "edited", "again", "elsewhere")


@pytest.fixture(scope="module")
def warm(pushed: dict[str, str], fleet: dict[str, str], login_registry, tmp_path_factory) -> dict:
    """The registry route's report of ORDER with the default pool, and the scan cache it left
    (every later run here is warm: no layer goes through a proxy)."""
    address, config, log = login_registry
    again = f"{address}/team/vllm:again"
    push_only_to_registry(fleet["patched"], again, config)
    refs = {**pushed, "again": again}
    cache = tmp_path_factory.mktemp("warm-cache")
    start = log.stat().st_size
    env = {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(config), "DSPARK_PATCH_CACHE": str(cache)}
    code, rows, _ = _status(*(a for k in ORDER for a in ("--image", refs[k])), "--via", "registry", env=env)
    fetched = _blob_gets(log, start)
    assert fetched and len(fetched) == len(set(fetched)), "a blob was fetched twice by the pool"
    return {"refs": refs, "cache": cache, "code": code, "rows": rows, "env": env}


def _proxied(address: str, proxy: str, config: Path, tmp_path: Path) -> Path:
    """A DOCKER_CONFIG holding the registry's login for the proxy's address too."""
    data = json.loads((config / "config.json").read_text())
    data["auths"][proxy] = data["auths"][address]
    folder = tmp_path / "proxy-config"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(data))
    return folder


def test_a_pool_of_one_gives_the_default_pools_report_in_the_order_given(warm: dict, login_registry) -> None:
    rows, refs = warm["rows"], warm["refs"]
    assert warm["code"] == 1 and [r["ref"] for r in rows] == [refs[k] for k in ORDER]
    assert [r["error"] for r in rows] == [None] * len(ORDER)
    by_kind = dict(zip(ORDER, rows, strict=True))
    assert _same(by_kind["again"]) == _same(by_kind["patched"]) and by_kind["patched"]["patch_sets"][PATCH_ID] == "applied"
    args = [a for k in ORDER for a in ("--image", refs[k])]
    _, _, log = login_registry
    start = log.stat().st_size
    code, one, _ = _status(*args, "--via", "registry", "--registry-connections", "1", "--jobs", "1", env=warm["env"])
    assert (code, one) == (warm["code"], rows)
    code, by_env, _ = _status(*args, "--via", "registry", env={**warm["env"], "DSPARK_PATCH_REGISTRY_CONNECTIONS": "1"})
    assert (code, by_env) == (warm["code"], rows)
    configs = {r["id"] for r in rows}
    assert set(_blob_gets(log, start)) <= configs, "a warm run fetched a layer"


def test_a_pool_size_that_is_not_a_count_is_one_line_before_any_request(tmp_path: Path) -> None:
    res = run("status", "--via", "registry", "--image", "127.0.0.1:9/team/vllm:x",
              env={"DOCKER_HOST": NO_ENGINE, "DSPARK_PATCH_REGISTRY_CONNECTIONS": "0"})
    assert res.returncode == 2 and "DSPARK_PATCH_REGISTRY_CONNECTIONS='0'" in res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) <= 2


@pytest.mark.parametrize("http_date", [False, True], ids=["seconds", "http-date"])
def test_a_registry_that_answers_429_gets_the_wait_it_asks_for(warm: dict, login_registry, tmp_path: Path,
                                                               http_date: bool) -> None:
    from tests.support.fault_proxy import Faults, fault_proxy

    address, config, _ = login_registry
    # Every manifest and every config: each answered 429 first, and again if asked too early.
    faults = Faults(throttle=r"/manifests/|/blobs/", wait_s=1, http_date=http_date)
    with fault_proxy(address, faults) as proxy:
        env = {**warm["env"], "DOCKER_CONFIG": str(_proxied(address, proxy, config, tmp_path))}
        refs = [warm["refs"][k].replace(address, proxy) for k in ORDER]
        code, rows, _ = _status(*(a for r in refs for a in ("--image", r)), "--via", "registry", env=env)
    assert code == warm["code"] and [r["ref"] for r in rows] == refs
    assert [_same(r) for r in rows] == [_same(r) for r in warm["rows"]]
    asked = {p for p in faults.requests if re.search(r"/manifests/|/blobs/", p)}
    assert asked and set(faults.throttled) == asked
    # One 429 per path: the client never came back before the wait had passed.
    assert all(n == 1 for n in faults.throttled.values()), faults.throttled
    assert all(faults.requests[p] >= 2 for p in asked)


def test_a_wait_longer_than_the_timeout_is_one_line_at_once(warm: dict, login_registry, tmp_path: Path) -> None:
    from tests.support.fault_proxy import Faults, fault_proxy

    address, config, _ = login_registry
    faults = Faults(throttle=r"/manifests/", wait_s=30)
    with fault_proxy(address, faults) as proxy:
        env = {**warm["env"], "DOCKER_CONFIG": str(_proxied(address, proxy, config, tmp_path)),
               "DSPARK_PATCH_REGISTRY_TIMEOUT": "5"}
        ref = warm["refs"]["patched"].replace(address, proxy)
        code, rows, _ = _status("--image", ref, "--via", "registry", env=env)
    assert code == 3 and "asks to wait 30 s" in rows[0]["error"] and not rows[0]["patch_sets"]
    assert sum(faults.requests.values()) - faults.requests["/v2/"] == 1  # asked once, no retry


def test_an_answer_broken_off_mid_body_is_read_again_or_is_one_line_never_a_verdict(
        warm: dict, login_registry, tmp_path: Path) -> None:
    from tests.support.fault_proxy import Faults, fault_proxy

    address, config, _ = login_registry
    by_kind = dict(zip(ORDER, warm["rows"], strict=True))
    # Once per manifest: each is read again, and the report is the same.
    faults = Faults(drop=r"/manifests/", drop_times=1)
    with fault_proxy(address, faults) as proxy:
        env = {**warm["env"], "DOCKER_CONFIG": str(_proxied(address, proxy, config, tmp_path))}
        refs = [warm["refs"][k].replace(address, proxy) for k in ORDER]
        code, rows, _ = _status(*(a for r in refs for a in ("--image", r)), "--via", "registry", env=env)
        assert faults.dropped and all(faults.requests[p] >= 2 for p in faults.dropped)
        assert code == warm["code"] and [_same(r) for r in rows] == [_same(r) for r in warm["rows"]]

        # Always, for one image's config: that row is one line (exit 3), the others are as they were.
        faults.drop, faults.drop_times = f"/blobs/{by_kind['edited']['id']}", 1000
        faults.dropped.clear()
        code, rows, _ = _status(*(a for r in refs for a in ("--image", r)), "--via", "registry", env=env)
    assert code == 3
    for kind, row in zip(ORDER, rows, strict=True):
        if kind == "edited":
            assert "broke off" in row["error"] and "\n" not in row["error"] and not row["patch_sets"], row
        else:
            assert _same(row) == _same(by_kind[kind]), kind
