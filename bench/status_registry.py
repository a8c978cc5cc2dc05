"""Benchmark: `status --via registry` on one image against fleets of 10, 100 and 1,000 tags, cold and warm.

A loopback registry behind a login (Debian's docker-registry, tests/support/registry.py) holds
the fixture and nine tags built FROM it (each a one-file COPY), so the ten share their base
layers as tags of one serving image do. With DOCKER_HOST pointing at nothing, it prints side by
side, from one run: the time and the bytes of layer blobs fetched (the registry's access log)
for one image with a cold cache, for the fleet with a cold cache, and for the fleet again with
the cache the first fleet run left (aims: fleet <= 1.5x one image in time and in bytes; warm:
no layer fetched).

Then, warm (every layer's scan cached), the scale figures: one tag against the fleet of 10, in
alternating rounds (aim: 10 tags <= 1.5x one tag), and 100 and 1,000 synthetic tags over the
fixture (bench/synthetic_tags.py: each the fixture plus a one-file layer of its own, written
into the registry's storage as a push would), read with the default pool and, for the same
tags, with a pool of one connection and one job (the serial route): the two reports must be
equal (aim: 1,000 tags warm under 60 s). The machine's load average is printed before and after.

Run: .venv/bin/python bench/status_registry.py [--tags 100,1000] [--rounds 3]
     (needs the engine to build and push the tags)
Not a test: timings vary with the machine; read the figures side by side.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import images  # noqa: E402
from tests.support.registry import login_registry_in, push_only_to_registry  # noqa: E402
from tests.support.seed import seeded  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from status_fleet import build_fleet  # noqa: E402  (the same fleet: one file of its own per tag)
from synthetic_tags import add_tags  # noqa: E402

CLI = str(ROOT / ".venv" / "bin" / "dspark-patch")
USER, PASSWORD = "bench", "bench-password"
# distribution's access log: "GET /v2/REPO/blobs/sha256:… HTTP/1.1" 200 BYTES
_GET = re.compile(r'"GET /v2/\S+/blobs/(sha256:[0-9a-f]{64}) HTTP/[0-9.]+" (\d{3}) (\d+)')


def fetched(log: Path, since: int, configs: set[str]) -> tuple[int, int]:
    """(layer blobs, their bytes) fetched since byte `since` of the log (configs not counted)."""
    text = log.read_bytes()[since:].decode("utf-8", "replace")
    layers = [(d, int(n)) for d, code, n in _GET.findall(text) if code == "200" and d not in configs]
    return len(layers), sum(n for _, n in layers)


def timed(refs: list[str], env: dict[str, str], *extra: str) -> tuple[float, list[dict]]:
    argv = [CLI, "status", "--json", "--via", "registry", "--jobs", "4", *extra]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as listing:  # 1,000 refs: a file, not argv
        listing.write("\n".join(refs) + "\n")
    argv += ["--images-from", listing.name]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **env})
    os.unlink(listing.name)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"dspark-patch status failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, json.loads(done.stdout)["images"]


def load() -> str:
    return " ".join(f"{v:.1f}" for v in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tags", default="100,1000", help="the synthetic fleets' sizes (comma list; empty: none)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of warm 1 tag against 10 tags")
    args = parser.parse_args()
    sizes = [int(n) for n in args.tags.split(",") if n.strip()]
    print(f"load before: {load()} ({os.cpu_count()} cores)", flush=True)
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
                warm_env = {**base, "DSPARK_PATCH_CACHE": str(work / "c10")}
                pairs = []
                for _ in range(args.rounds):  # alternating, so both see the same machine
                    pairs.append((timed(remote[:1], warm_env)[0], timed(remote, warm_env)[0]))
                scale = {}
                if sizes:
                    storage = work / "registry" / "storage"
                    synthetic = [f"{address}/team/vllm:{t}"
                                 for t in add_tags(storage, seeded(fixture), "team/vllm", max(sizes))]
                    timed(synthetic, warm_env)  # their own small layers into the cache: warm from here
                    for n in sizes:
                        start = log.stat().st_size
                        seconds, rows = timed(synthetic[:n], warm_env)
                        blobs = fetched(log, start, {r["id"] for r in rows if r.get("id")})[0]
                        serial, serial_rows = timed(synthetic[:n], warm_env, "--registry-connections", "1", "--jobs", "1")
                        scale[n] = (seconds, serial, blobs, rows == serial_rows,
                                    sum(1 for r in rows if r.get("error")), len(rows))
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
    one_w, ten_w = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
    print(f"warm, {len(pairs)} alternating rounds, medians: 1 tag {one_w:.2f}s, 10 tags {ten_w:.2f}s: "
          f"{ten_w / one_w:5.2f}x (aim: <= 1.5x); rounds " + ", ".join(f"{a:.2f}/{b:.2f}" for a, b in pairs))
    for n, (seconds, serial, blobs, same, errors, count) in scale.items():
        print(f"warm, {n:5d} synthetic tags: {seconds:7.2f}s with the default pool, {serial:7.2f}s serial "
              f"(pool of 1, --jobs 1): {serial / seconds:4.2f}x; {seconds / n * 1000:5.0f} ms a tag; layer blobs "
              f"fetched: {blobs}; same report: {'yes' if same else 'NO'}; rows {count}, errors {errors}"
              + ("  (aim: < 60 s)" if n == 1000 else ""))
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
