"""Benchmark: `status --via registry` on one image against a fleet of 10 tags, cold and warm.

A loopback registry behind a login (Debian's docker-registry, tests/support/registry.py) holds
the fixture and nine tags built FROM it (each a one-file COPY), so the ten share their base
layers as tags of one serving image do. With DOCKER_HOST pointing at nothing, it prints side by
side, from one run: the time and the bytes of layer blobs fetched (the registry's access log)
for one image with a cold cache, for the fleet with a cold cache, and for the fleet again with
the cache the first fleet run left (aims: fleet <= 1.5x one image in time and in bytes; warm:
no layer fetched).

Run: .venv/bin/python bench/status_registry.py   (needs the engine to build and push the tags)
Not a test: timings vary with the machine; read the figures side by side.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import images  # noqa: E402
from tests.support.registry import login_registry_in, push_only_to_registry  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from status_fleet import build_fleet  # noqa: E402  (the same fleet: one file of its own per tag)

CLI = str(ROOT / ".venv" / "bin" / "dspark-patch")
USER, PASSWORD = "bench", "bench-password"
# distribution's access log: "GET /v2/REPO/blobs/sha256:… HTTP/1.1" 200 BYTES
_GET = re.compile(r'"GET /v2/\S+/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" (\d{3}) (\d+)')


def fetched(log: Path, since: int, configs: set[str]) -> tuple[int, int]:
    """(layer blobs, their bytes) fetched since byte `since` of the log (configs not counted)."""
    text = log.read_bytes()[since:].decode("utf-8", "replace")
    layers = [(d, int(n)) for d, code, n in _GET.findall(text) if code == "200" and d not in configs]
    return len(layers), sum(n for _, n in layers)


def timed(refs: list[str], env: dict[str, str]) -> tuple[float, list[dict]]:
    argv = [CLI, "status", "--json", "--via", "registry", "--jobs", "4"]
    for ref in refs:
        argv += ["--image", ref]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env})
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"dspark-patch status failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout)["images"]


def main() -> None:
    fixture = images.fixture_image()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        local = [fixture, *build_fleet(fixture, work, 9, prefix="bench-registry")]
        try:
            with login_registry_in(work, USER, PASSWORD) as (address, config, log):
                remote = []
                for i, ref in enumerate(local):
                    target = f"{address}/team/vllm:t{i}"
                    push_only_to_registry(ref, target, config)
                    remote.append(target)
                base = {"DOCKER_HOST": "tcp://127.0.0.1:9", "DOCKER_CONFIG": str(config)}
                results = {}
                for label, refs, cache in (("one image, cold cache", remote[:1], "c1"),
                                           ("fleet of 10, cold cache", remote, "c10"),
                                           ("fleet of 10, warm cache", remote, "c10")):
                    start = log.stat().st_size
                    seconds, rows = timed(refs, {**base, "DSPARK_PATCH_CACHE": str(work / cache)})
                    configs = {r["id"] for r in rows if r.get("id")}
                    results[label] = (seconds, *fetched(log, start, configs), rows)
                cache_bytes = sum(p.stat().st_size for p in (work / "c10").rglob("*.scan"))
        finally:
            subprocess.run(["docker", "rmi", "-f", *local[1:]], capture_output=True, check=False)
    for label, (seconds, blobs, size, rows) in results.items():
        errors = [r["error"] for r in rows if r.get("error")]
        print(f"{label:<26} {seconds:7.2f}s   layer blobs fetched: {blobs:3d}   bytes: {size / 1e6:9.1f} MB"
              f"   rows: {len(rows)}{'  errors: ' + '; '.join(errors) if errors else ''}")
    one, fleet, warm = (results[k] for k in results)
    print(f"fleet / one image: time {fleet[0] / one[0]:5.2f}x, bytes {fleet[2] / max(one[2], 1):5.2f}x  (aim: <= 1.5x)")
    print(f"warm fleet: {warm[1]} layer blobs fetched (aim: 0), {warm[0]:.2f}s; warm / cold fleet time "
          f"{warm[0] / fleet[0]:5.2f}x; cache on disk {cache_bytes / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
