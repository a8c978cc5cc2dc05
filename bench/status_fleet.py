"""Benchmark: `dspark-patch status` on one image against a fleet of five.

The fleet is the fixture and four images built FROM it (each a one-file COPY: a different
vLLM module edited), so all five are distinct images of the same size that share their lower
layers, as tags of one serving image do. Prints the wall time of `status` for one image and
for the fleet (--jobs 5), side by side, and their ratio (aim: under 2x), alternating rounds.

Run: .venv/bin/python bench/status_fleet.py [ROUNDS]   (needs the engine and fixture images)
Not a test: timings vary with the machine; read the figures side by side.
"""

from __future__ import annotations

import secrets
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
VIAS = ("layers", "container")


def build_fleet(fixture: str, work: Path) -> list[str]:
    name = f"dspark-patch/bench-status-{secrets.token_hex(3)}"
    refs = []
    for i in range(4):
        context = work / str(i)
        context.mkdir()
        (context / "f").write_text(f"# bench edit {i}\n")
        (context / "Dockerfile").write_text(f"FROM {fixture}\nCOPY f {SITE}/vllm/bench_edit_{i}.py\n")
        subprocess.run(["docker", "build", "--quiet", "--network", "none", "-t", f"{name}:{i}", str(context)],
                       check=True, capture_output=True)
        refs.append(f"{name}:{i}")
    return refs


def timed_status(refs: list[str], via: str) -> float:
    argv = [CLI, "status", "--json", "--jobs", str(len(refs)), "--via", via]
    for ref in refs:
        argv += ["--image", ref]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        sys.exit(f"dspark-patch status failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    fixture = images.fixture_image()
    with tempfile.TemporaryDirectory() as tmp:
        fleet = [fixture, *build_fleet(fixture, Path(tmp))]
        try:
            times: dict[tuple[str, int], list[float]] = {}
            for _ in range(rounds):  # alternate so a load change on a shared machine hits all
                for via in VIAS:
                    for refs in ([fixture], fleet):
                        times.setdefault((via, len(refs)), []).append(timed_status(refs, via))
        finally:
            subprocess.run(["docker", "rmi", "-f", *fleet[1:]], capture_output=True, check=False)
    for via in VIAS:
        one, five = min(times[via, 1]), min(times[via, len(fleet)])
        print(f"--via {via:<9} one image: {one:7.2f}s   fleet of {len(fleet)}: {five:7.2f}s   "
              f"fleet / one: {five / one:5.2f}x  (aim: under 2x)")
    print(f"one image, container / layers: {min(times['container', 1]) / min(times['layers', 1]):5.2f}x")
    auto = min(times["layers", len(fleet)]) / min(times["container", 1])
    print(f"--via auto (container for one, layers for the fleet): fleet / one: {auto:5.2f}x  (aim: under 2x)")


if __name__ == "__main__":
    main()
