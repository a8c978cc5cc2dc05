"""Benchmark: `dspark-patch status` on one image against a fleet of five, and big against small.

The fleet is the fixture and four images built FROM it (each a one-file COPY: a different
vLLM module edited), so all five are distinct images of the same size that share their lower
layers, as tags of one serving image do. Prints the wall time of `status` for one image and
for the fleet (--jobs 5), side by side, and their ratio (aim: under 2x), alternating rounds,
for each route with a cold layer-scan cache (a fresh DSPARK_PATCH_CACHE each run) and, for the
routes that use it (auto, layers), with a warm one.

With `--big`: also the fixture against `big` (the fixture on a ~3 GB, ~103,000-file lower
layer, `scripts/build-images --big`, built once), on the default route and `--via layers`, cold
and warm (aim: big / small at most 1.15x), and beside them the engine's own
`docker save` of each image into a pipe: what `--via layers` must read when a layer of the image
is not in the scan cache yet (dockerd has no call that exports one layer), so its cold figure is
that floor, once per layer; the warm figures say whether anything else grows with the image.

Before each timed run the bench waits (at most 30 s) for the machine to be quiet: after a save
the engine goes on with work of its own (it removes the folder it exported the layers into, and
the kernel writes back what that left), seconds for `big`'s 103,000 files, and a run timed then
pays for the run before it (a warm `--via layers` of `big` took 1.25 s right after a cold one,
0.91 s fifteen seconds later). The seconds waited are printed, and not counted.

Run: .venv/bin/python bench/status_fleet.py [ROUNDS] [--big]   (needs the engine and fixture images)
Not a test: timings vary with the machine; read the figures side by side.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support import images  # noqa: E402

SITE = "/usr/local/lib/python3.11/dist-packages"
CLI = str(ROOT / ".venv" / "bin" / "dspark-patch")
VIAS = ("auto", "layers", "container")
CACHED = ("auto", "layers")   # the routes the scan cache serves
SETTLED = [0.0]               # seconds waited for a quiet machine, in all


def _cpu_busy(interval: float) -> float:
    """The share of the machine's CPU time that was not idle over `interval` (I/O wait counts as
    busy: an engine removing a folder waits on the disk)."""
    def sample() -> tuple[int, int]:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
        return sum(fields), fields[3]
    total0, idle0 = sample()
    time.sleep(interval)
    total1, idle1 = sample()
    return 1.0 - (idle1 - idle0) / max(total1 - total0, 1)


def settle(limit: float = 30.0) -> None:
    """Wait until the machine is quiet (under 15% busy for half a second), at most `limit` s."""
    start = time.monotonic()
    subprocess.run(["sync"], check=False)
    while time.monotonic() - start < limit and _cpu_busy(0.5) >= 0.15:
        pass
    SETTLED[0] += time.monotonic() - start


def build_fleet(fixture: str, work: Path, count: int = 4, prefix: str = "bench-status") -> list[str]:
    """`count` images on `fixture`, each with one small file of its own (their base layers shared)."""
    name = f"dspark-patch/{prefix}-{secrets.token_hex(3)}"
    refs = []
    for i in range(count):
        context = work / f"ctx{i}"
        context.mkdir()
        (context / "f").write_text(f"# bench edit {i}\n")
        (context / "Dockerfile").write_text(f"FROM {fixture}\nCOPY f {SITE}/vllm/bench_edit_{i}.py\n")
        subprocess.run(["docker", "build", "--quiet", "--network", "none", "-t", f"{name}:{i}", str(context)],
                       check=True, capture_output=True)
        refs.append(f"{name}:{i}")
    return refs


def timed_status(refs: list[str], via: str, cache: Path) -> float:
    argv = [CLI, "status", "--json", "--jobs", str(len(refs)), "--via", via]
    for ref in refs:
        argv += ["--image", ref]
    settle()
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "DSPARK_PATCH_CACHE": str(cache)})
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"dspark-patch status failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def cold(refs: list[str], via: str, work: Path) -> float:
    cache = work / f"cold-{secrets.token_hex(4)}"
    try:
        return timed_status(refs, via, cache)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def warm(refs: list[str], via: str, work: Path) -> float:
    cache = work / f"warm-{via}-{'-'.join(r.replace('/', '_') for r in refs)}"
    if not cache.exists():
        timed_status(refs, "layers", cache)  # fills it (the container route reads no layers)
    return timed_status(refs, via, cache)


def engine_save(ref: str) -> float:
    """`docker save REF` into a pipe that only counts the bytes: the engine's own export."""
    settle()
    start = time.perf_counter()
    with subprocess.Popen(["docker", "save", ref], stdout=subprocess.PIPE) as save:
        assert save.stdout is not None
        while save.stdout.read(1 << 20):
            pass
    if save.returncode != 0:
        sys.exit(f"docker save {ref} failed (exit {save.returncode})")
    return time.perf_counter() - start


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--big"]
    rounds = int(args[0]) if args else 2
    fixture = images.fixture_image()
    big = None
    if "--big" in sys.argv:
        done = subprocess.run([str(ROOT / "scripts" / "build-images"), "--big"], capture_output=True, text=True)
        if done.returncode != 0:
            sys.exit(f"scripts/build-images --big failed:\n{done.stderr[-3000:]}")
        big = dict(line.split(" ", 1) for line in done.stdout.splitlines())["big"]
    times: dict[tuple[str, str, int], list[float]] = {}
    sizes: dict[tuple[str, str, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fleet = [fixture, *build_fleet(fixture, work)]
        try:
            for _ in range(rounds):  # alternate so a load change on a shared machine hits all
                for via in VIAS:
                    for refs in ([fixture], fleet):
                        times.setdefault((via, "cold", len(refs)), []).append(cold(refs, via, work))
                        if via in CACHED:
                            times.setdefault((via, "warm", len(refs)), []).append(warm(refs, via, work))
                if big is not None:
                    for via in CACHED:
                        for name, ref in (("small", fixture), ("big", big)):
                            sizes.setdefault((via, "cold", name), []).append(cold([ref], via, work))
                            sizes.setdefault((via, "warm", name), []).append(warm([ref], via, work))
                    for name, ref in (("small", fixture), ("big", big)):
                        sizes.setdefault(("save", "engine", name), []).append(engine_save(ref))
        finally:
            subprocess.run(["docker", "rmi", "-f", *fleet[1:]], capture_output=True, check=False)
    n = len(fleet)
    for via in VIAS:
        for state in ("cold", "warm"):
            if (via, state, 1) not in times:
                continue
            one, many = min(times[via, state, 1]), min(times[via, state, n])
            print(f"--via {via:<9} {state} cache  one image: {one:7.2f}s   fleet of {n}: {many:7.2f}s   "
                  f"fleet / one: {many / one:5.2f}x  (aim: under 2x)")
    print(f"one image, cold, container / layers: {min(times['container', 'cold', 1]) / min(times['layers', 'cold', 1]):5.2f}x")
    for via in CACHED if sizes else ():
        for state in ("cold", "warm"):
            small, large = min(sizes[via, state, "small"]), min(sizes[via, state, "big"])
            print(f"--via {via:<9} {state} cache  fixture: {small:7.2f}s   big (+3 GB, +103k files): {large:7.2f}s   "
                  f"big / small: {large / small:5.2f}x  (aim: at most 1.15x)")
    if sizes:
        small, large = min(sizes["save", "engine", "small"]), min(sizes["save", "engine", "big"])
        print(f"docker save (engine)   fixture: {small:7.2f}s   big (+3 GB, +103k files): {large:7.2f}s   "
              f"big / small: {large / small:5.2f}x  (the floor of a cold --via layers: every layer, once)")
    print(f"waited for a quiet machine before the timed runs: {SETTLED[0]:.1f} s in all (not counted)")


if __name__ == "__main__":
    main()
