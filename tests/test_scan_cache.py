"""The layer-scan cache (targets/caches/scans.py) and the registry route's faults, without an engine.

The registry here is `tests/support/fake_registry.py` serving what `tests/support/oci.py` writes
(the bytes a push leaves), because the faults — a blob that is not its digest, an endless blob, a
decompression bomb, a manifest of a million layers — are ones Debian's registry refuses to store.
The honest reading through a real registry with a login is tests/test_status_registry.py.
"""

from __future__ import annotations

import gzip
import io
import multiprocessing
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from dspark_patch.errors import BadInput
from dspark_patch.targets.caches import seal
from dspark_patch.targets.caches.scans import MAGIC, ScanCache, parse_size
from dspark_patch.targets.layers import merge, scan_layer
from dspark_patch.targets.layers.scan import path_key
from dspark_patch.targets.views.from_layers import status_retain, status_retain_identity
from tests.support import hostile, oci
from tests.support.fake_registry import fake_registry
from tests.support.hostile import Dir, File, Link, Whiteout
from tests.test_hostile_layers import CONFIG, python_layer, registry_reader, site_layer, trees, verdict

__all__ = ["trees"]  # the module fixture, shared


def _layer() -> bytes:
    return hostile.layer([Dir("usr"), Dir("usr/lib"), File("usr/lib/a.py", b"x\n"), Link("usr/lib/b", "a.py"),
                          Whiteout("usr/old"), Dir("usr/local"), File("usr/local/bin", b"not a folder")])


def _scan(data: bytes):
    return scan_layer(io.BytesIO(data), where="a layer", retain=status_retain("vllm"))


def test_path_keys_are_the_same_in_another_process() -> None:
    # A scan cached by one run is merged by another: the keys of `present` must not be Python's
    # per-process hash (PYTHONHASHSEED differs per process).
    code = "from dspark_patch.targets.layers.scan import path_key; print(path_key('usr/lib/python3.11'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": "random"})
    assert int(other.stdout) == path_key("usr/lib/python3.11")


def test_a_scan_comes_back_whole_and_only_for_its_predicate(tmp_path: Path) -> None:
    data = _layer()
    scan = _scan(data)
    ScanCache(tmp_path, identity=status_retain_identity("vllm")).put(hostile.diff_id(data), scan)
    again = ScanCache(tmp_path, identity=status_retain_identity("vllm")).get(hostile.diff_id(data))
    assert again == scan and merge([again]).entries == merge([scan]).entries
    # Kept for another predicate (other patched paths, another distribution): never reused.
    assert ScanCache(tmp_path, identity=status_retain_identity("vllm", ["vllm/envs.py"])).get(hostile.diff_id(data)) is None
    assert ScanCache(tmp_path, identity=status_retain_identity("torch")).get(hostile.diff_id(data)) is None
    # Nothing but the cache's own entries was written, all under its folder.
    assert [p.suffix for p in tmp_path.rglob("*") if p.is_file()] == [".scan"]


@pytest.mark.parametrize("damage", ["truncated", "one byte flipped", "empty", "another entry's bytes", "not ours"])
def test_a_damaged_entry_is_a_miss_never_an_error(tmp_path: Path, damage: str) -> None:
    cache = ScanCache(tmp_path, identity=status_retain_identity("vllm"))
    data, other = _layer(), hostile.layer([File("etc/x", b"1")])
    cache.put(hostile.diff_id(data), _scan(data))
    cache.put(hostile.diff_id(other), _scan(other))
    (entry,) = [p for p in tmp_path.rglob("*.scan") if p.read_bytes() and cache._path(hostile.diff_id(data)) == p]
    raw = entry.read_bytes()
    entry.write_bytes({"truncated": raw[:len(raw) // 2], "one byte flipped": raw[:-1] + bytes([raw[-1] ^ 1]),
                       "empty": b"", "another entry's bytes": cache._path(hostile.diff_id(other)).read_bytes(),
                       "not ours": MAGIC + os.urandom(64)}[damage])
    assert ScanCache(tmp_path, identity=cache.identity).get(hostile.diff_id(data)) is None


def test_the_cache_stays_under_its_bound_dropping_the_least_recently_used(tmp_path: Path) -> None:
    layers = [hostile.layer([File(f"usr/lib/python3.11/site-packages/vllm-{i}.dist-info/RECORD", os.urandom(4000))])
              for i in range(6)]
    one = len(MAGIC) + 32 + len(zlib.compress(b"x")) + 5000
    cache = ScanCache(tmp_path, identity="t", max_bytes=3 * one)
    for i, data in enumerate(layers):
        cache.put(hostile.diff_id(data), _scan(data))
        os.utime(cache._path(hostile.diff_id(data)), (1000 + i, 1000 + i))
        if i == 1:
            assert cache.get(hostile.diff_id(layers[0])) is not None  # used again: kept longer
    total = sum(p.stat().st_size for p in tmp_path.rglob("*.scan"))
    assert total <= 3 * one
    assert cache.get(hostile.diff_id(layers[-1])) is not None
    assert cache.get(hostile.diff_id(layers[1])) is None
    assert parse_size("2G", "--cache-max") == 2 << 30 and parse_size("500m", "--cache-max") == 500 << 20
    with pytest.raises(BadInput, match="is not a size"):
        parse_size("lots", "--cache-max")


def _hammer(root: str, seed: int) -> int:
    data = _layer()
    want = _scan(data)
    cache = ScanCache(Path(root), identity="shared")
    bad = 0
    for _ in range(150):
        cache.put(hostile.diff_id(data), want)
        got = cache.get(hostile.diff_id(data))
        bad += got is not None and got != want
    return bad


def test_two_runs_at_once_share_the_cache_safely(tmp_path: Path) -> None:
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        assert pool.starmap(_hammer, [(str(tmp_path), 1), (str(tmp_path), 2)]) == [0, 0]
    assert not list(tmp_path.rglob(".tmp-*")), "a temporary file was left behind"


# --- the registry route: faults, and what the cache saves ----------------------------------------
REF = "test/img:v1"


def _blob_gets(seen: list[str]) -> list[str]:
    return [line for line in seen if "/blobs/" in line]


def test_a_second_run_fetches_no_layer_and_a_layer_shared_by_tags_is_fetched_once(trees, tmp_path: Path) -> None:
    layers = [python_layer(), site_layer(trees["patched"])]
    served, _ = oci.served_image(layers, config=CONFIG)
    other, _ = oci.served_image([*layers, hostile.layer([File("etc/motd", b"hi\n")])], config=CONFIG, tag="v2")
    served.update(other)
    with fake_registry(served) as (address, seen):
        first = registry_reader(tmp_path).read(f"{address}/{REF}")
        second = registry_reader(tmp_path).read(f"{address}/test/img:v2")
        assert first and second and verdict(first[0]) == verdict(second[0]) == (None, "applied", False)
        # v2 shares v1's two layers: only its own top layer was fetched for it.
        layer_digests = [line.split("/blobs/")[1] for line in _blob_gets(seen)]
        assert len(layer_digests) == len(set(layer_digests)) == 2 + 1 + 1 + 1  # 2 configs, 3 layers
        seen.clear()
        again = registry_reader(tmp_path).read(f"{address}/{REF}")
        assert again == first
        assert [line for line in _blob_gets(seen) if "sha256:" in line] and all(
            "application" not in line for line in seen)
        fetched = [line.split("/blobs/")[1] for line in _blob_gets(seen)]
        config_digest = first[0].id
        assert fetched == [config_digest], fetched  # the config, and no layer at all


@pytest.mark.parametrize("fault", ["another blob's bytes", "one byte changed", "cut short", "missing",
                                   "diff_id disagrees"])
def test_a_blob_that_is_not_its_digest_is_an_error_row_and_never_cached(trees, tmp_path: Path, fault: str) -> None:
    layers = [python_layer(), site_layer(trees["patched"])]
    honest, _ = oci.served_image(layers, config=CONFIG)
    site_blob = oci.digest(gzip.compress(layers[1], mtime=0))
    key = f"test/img/blobs/{site_blob}"
    body = honest[key][1]
    if fault == "diff_id disagrees":  # the config names another uncompressed digest for the layer
        tampered = dict(CONFIG)
        served, _ = oci.served_image([layers[0], site_layer(trees["clean"])], config=tampered)
        served = _swap_layer(served, layers[1])
    else:
        served = dict(honest)
        if fault == "missing":
            del served[key]
        else:
            served[key] = ("application/octet-stream", {
                "another blob's bytes": gzip.compress(site_layer(trees["clean"]), mtime=0),
                "one byte changed": body[:100] + bytes([body[100] ^ 1]) + body[101:],
                "cut short": body[:-10]}[fault])
    with fake_registry(served) as (address, _seen):
        (row,) = registry_reader(tmp_path).read(f"{address}/{REF}") or ()
    assert row.error is not None and row.exit_code in (1, 3) and not row.patch_sets, row
    assert {"missing": "no blob", "diff_id disagrees": "diff_id"}.get(fault, "digest") in row.error, row.error
    # Only the honest python layer may have been kept; the refused one never.
    with fake_registry(honest) as (address, seen):
        (row,) = registry_reader(tmp_path).read(f"{address}/{REF}") or ()
        assert verdict(row) == (None, "applied", False)
        assert f"{site_blob}" in " ".join(_blob_gets(seen))


def _swap_layer(served: dict, layer: bytes) -> dict:
    """Serve `layer` (gzip) under the digest the manifest names for the site layer, as if the
    registry's copy matched the blob digest but not the config's diff_id."""
    import json

    manifest = json.loads(served["test/img/manifests/v1"][1])
    wrong = gzip.compress(layer, mtime=0)
    manifest["layers"][1] = {**manifest["layers"][1], "digest": oci.digest(wrong), "size": len(wrong)}
    body = json.dumps(manifest).encode()
    out = {k: v for k, v in served.items() if "/manifests/" not in k}
    out[f"test/img/blobs/{oci.digest(wrong)}"] = ("application/octet-stream", wrong)
    out["test/img/manifests/v1"] = (oci.OCI_MANIFEST, body)
    return out


def test_a_decompression_bomb_an_endless_layer_and_a_million_layers_are_one_line_each(trees, tmp_path: Path) -> None:
    import json

    # A bomb: a member of 1 GiB of zeros, about 1 MiB compressed (over 256× + 256 MiB).
    bomb_blob = hostile.gzip_of_repeats(hostile.raw_header(b"usr/zeros", size=1 << 30), bytes(1 << 20), 1024)
    assert len(bomb_blob) < 2 << 20
    served, _ = oci.served_image([python_layer()], config=CONFIG)
    manifest = json.loads(served["test/img/manifests/v1"][1])
    config_key = f"test/img/blobs/{manifest['config']['digest']}"
    config = json.loads(served[config_key][1])
    config["rootfs"]["diff_ids"].append("sha256:" + "0" * 64)
    config_blob = json.dumps(config).encode()
    manifest["config"] = {**manifest["config"], "digest": oci.digest(config_blob), "size": len(config_blob)}
    manifest["layers"].append({"mediaType": oci.GZIP_LAYER, "digest": oci.digest(bomb_blob), "size": len(bomb_blob)})
    bomb = dict(served)
    bomb[f"test/img/blobs/{oci.digest(config_blob)}"] = ("application/octet-stream", config_blob)
    bomb[f"test/img/blobs/{oci.digest(bomb_blob)}"] = ("application/octet-stream", bomb_blob)
    bomb["test/img/manifests/v1"] = (oci.OCI_MANIFEST, json.dumps(manifest).encode())
    # Endless: the blob is longer than the manifest says.
    endless = dict(served)
    first = manifest["layers"][0]["digest"]
    endless[f"test/img/blobs/{first}"] = ("application/octet-stream", served[f"test/img/blobs/{first}"][1] + bytes(1 << 20))
    # A million layers: over the 4 MiB a manifest may be; 20,000 fit in it and are still refused.
    million, many = dict(served), dict(served)
    for target, count in ((million, 1_000_000), (many, 20_000)):
        listed = dict(manifest, layers=[manifest["layers"][0]] * count)
        target["test/img/manifests/v1"] = (oci.OCI_MANIFEST, json.dumps(listed, separators=(",", ":")).encode())
    for served_here, says in ((bomb, "decompression bomb"), (endless, "more than the"), (many, "layers, more than the"),
                              (million, "MiB this tool reads")):
        with fake_registry(served_here) as (address, _seen):
            (row,) = registry_reader(tmp_path / says).read(f"{address}/{REF}") or ()
        assert row.error is not None and says in row.error and "\n" not in row.error, row.error
        assert row.exit_code in (1, 2) and not row.patch_sets
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size > 1 << 20]


def test_the_cli_reads_a_registry_with_no_engine_and_auto_does_too(trees, tmp_path: Path) -> None:
    import json

    from tests.support.cli import run

    served, _ = oci.served_image([python_layer(), site_layer(trees["patched"])], config=CONFIG)
    env = {"DOCKER_HOST": "tcp://127.0.0.1:9", "DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    with fake_registry(served) as (address, _seen):
        ref = f"{address}/{REF}"
        rows = []
        for via in ("registry", "auto"):
            res = run("status", "--json", "--image", ref, "--via", via, env=env)
            assert "Traceback" not in res.stderr, res.stderr
            (row,) = json.loads(res.stdout)["images"]
            assert row["ref"] == ref and row["error"] is None and row["platform"] == "linux/amd64", row
            assert row["patch_sets"]["dspark-skip-mtp-buffer"] == "applied"
            rows.append(row)
        assert [r | {"route": None} for r in rows] == [rows[0] | {"route": None}] * 2
        assert rows[0]["route"]["reason"].startswith("asked with --via registry")
        assert rows[1]["route"]["reason"].startswith("no engine answered at $DOCKER_HOST, and every image names")
    # An image named without a registry, with no engine: the engine's own exit 3, as before.
    assert "cannot reach a Docker engine" in run("status", "--image", "local:1", env=env).assert_clean_error(3)
    assert "--via registry" in run("status", "--image", "a/b:1", "--via", "registry", "--pull", "missing",
                                   env=env).assert_clean_error(2)
    assert "not a size" in run("status", "--image", "a/b:1", "--cache-max", "lots", env=env).assert_clean_error(2)


@pytest.mark.engine
def test_the_save_route_keeps_every_layer_under_its_own_diff_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real engine's save: every layer of the image is kept under the digest the engine names
    it by (its tar hashed as read, to its last padding block), so the next run reads no layer."""
    import json as _json

    from dspark_patch.patchset import available
    from dspark_patch.status.fleet import StatusRequest, patched_paths, scan_cache
    from tests.support import images
    from tests.support.cli import run

    fixture = images.fixture_image()
    env = {"DSPARK_PATCH_CACHE": str(tmp_path / "cache")}
    first = run("status", "--via", "layers", "--json", "--image", fixture, env=env)
    assert first.returncode in (0, 1) and "Traceback" not in first.stderr, first.stderr
    diff_ids = _json.loads(subprocess.run(["docker", "image", "inspect", "-f", "{{json .RootFS.Layers}}", fixture],
                                          capture_output=True, text=True, check=True).stdout)
    patchsets = [p for p in available() if not p.is_bare]
    monkeypatch.setenv("DSPARK_PATCH_CACHE", env["DSPARK_PATCH_CACHE"])
    cache = scan_cache(StatusRequest(images=(fixture,)), patchsets)
    assert patched_paths(patchsets) and all(cache.get(d) is not None for d in diff_ids), diff_ids
    again = run("status", "--via", "layers", "--json", "--image", fixture, env=env)
    strip = ("seconds", "started_at")
    assert {k: v for k, v in again.json.items() if k not in strip} == {k: v for k, v in first.json.items() if k not in strip}


_OTHER_HOST = """
import sys
from pathlib import Path
from dspark_patch.targets.caches.scans import ScanCache
from dspark_patch.targets.layers import scan_layer
from dspark_patch.targets.views.from_layers import status_retain, status_retain_identity
data = Path(sys.argv[1]).read_bytes()
cache = ScanCache(Path(sys.argv[2]), identity=status_retain_identity("vllm"))
import io
cache.put(sys.argv[3], scan_layer(io.BytesIO(data), where="a layer", retain=status_retain("vllm")))
again = ScanCache(Path(sys.argv[2]), identity=status_retain_identity("vllm")).get(sys.argv[3])
print(sys.version_info[1], cache.stores, again is not None)
"""


@pytest.mark.engine
def test_hosts_of_two_python_minors_sharing_one_cache_never_answer_each_other(tmp_path: Path) -> None:
    """A scan keeps each source's `source_hash`, keyed by the scanning python's magic
    number. The trixie base's python 3.13 and this host's 3.11 share one cache folder and one
    key: each keeps its own entry and reads only its own."""
    from tests.support import images

    root = Path(__file__).resolve().parents[1]
    data = hostile.layer([Dir("usr"), Dir("usr/lib"), File("usr/lib/a.py", b"x = 1\n")])
    (tmp_path / "layer.tar").write_bytes(data)
    (tmp_path / "cache").mkdir()
    here = ScanCache(tmp_path / "cache", identity=status_retain_identity("vllm"))
    here.put(hostile.diff_id(data), _scan(data))     # kept by this host's python (3.11)
    key = seal.key_path()                             # the one key both hosts use
    assert here.stores == 1 and key.is_file()
    other = subprocess.run(
        ["docker", "run", "--rm", "--network", "none", "--user", f"{os.getuid()}:{os.getgid()}",
         "-v", f"{root}:/src:ro", "-v", f"{tmp_path}:{tmp_path}", "-v", f"{key}:{key}:ro", "-w", "/src", "-e", "PYTHONPATH=/src",
         "-e", f"DSPARK_PATCH_CACHE_KEY={key}", images.built_images()["trixie-base"],
         "python3", "-c", _OTHER_HOST, str(tmp_path / "layer.tar"), str(tmp_path / "cache"), hostile.diff_id(data)],
        capture_output=True, text=True, check=False)
    assert other.returncode == 0, other.stderr
    minor, stores, hit = other.stdout.split()
    assert minor != str(sys.version_info[1]) and stores == "1" and hit == "True", other.stdout
    # Two entries, one per python; this host still reads its own, and only its own.
    assert len(list((tmp_path / "cache").rglob("*.scan"))) == 2
    assert ScanCache(tmp_path / "cache", identity=status_retain_identity("vllm")).get(hostile.diff_id(data)) == _scan(data)
