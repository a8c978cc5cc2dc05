"""Benchmark: what apply's read of the source image's layers with the strict reader costs.

`apply --image --strict-layers` reads the source's layers as `status --via layers` does
(pipeline/image_steps.py: LayerCheck, in a thread beside the other steps, waited for before the
commit), keeping each layer's scan in the scan cache by diff_id; without the option only cached
scans are read. This runs `dspark-patch apply --image` on the fixture three ways, alternately for
a few rounds: without the check (the same CLI with `LayerCheck` replaced by a no-op, in a
subprocess), with it and every layer cached (the usual case once one status or apply run has
read the image), and with it and an empty cache (a save of the whole image), and prints each
time, the medians and their ratios to "without".

Run: .venv/bin/python bench/apply_layer_check.py [ROUNDS] [--probe]   (needs the engine and the fixture)
Not a test: timings vary with the machine; read the figures side by side.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from apply_base_check import PY, WITH, fixture  # noqa: E402  (the same CLI runner and fixture)

TAG = "dspark-patch/bench:layer-check-{}"
WITHOUT = ("import sys; from dspark_patch.pipeline import commands\n"
           "class NoCheck:\n"
           "    def __init__(self, *a, **k): pass\n"
           "    def join(self, run): pass\n"
           "    def cancel(self): pass\n"
           "    def cache_new_layer(self): pass\n"
           "commands.LayerCheck = NoCheck\n"
           "from dspark_patch.cli import main; sys.argv = ['dspark-patch', *sys.argv[1:]]; main()")
WAYS = ("without", "cached", "uncached")


def apply_seconds(ref: str, way: str, work: Path, probe: bool) -> float:
    env = dict(os.environ)
    if way == "uncached":
        env["DSPARK_PATCH_CACHE"] = str(work / "empty-cache")  # a fresh folder each time: a save
    start = time.perf_counter()
    done = subprocess.run([str(PY), "-c", WITHOUT if way == "without" else WITH, "apply", "--image", ref,
                           "--pull", "never", "--tag", TAG.format(way), "--force", "--report-dir", str(work / "r"),
                           *([] if probe else ["--no-probe"]), *([] if way == "without" else ["--strict-layers"])],
                          capture_output=True, text=True, check=False, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"apply ({way}) failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    args = [a for a in sys.argv[1:] if a != "--probe"]
    rounds = int(args[0]) if args else 3
    probe = "--probe" in sys.argv[1:]
    ref = fixture()
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            apply_seconds(ref, "cached", Path(tmp) / "warm", probe)  # fills the real cache for "cached"
            for i in range(rounds):
                for way in WAYS:
                    seconds = apply_seconds(ref, way, Path(tmp) / f"{i}-{way}", probe)
                    times[way].append(seconds)
                    print(f"round {i + 1}: apply {way:>8}: {seconds:6.1f} s", flush=True)
    finally:
        subprocess.run(["docker", "rmi", "-f", *(TAG.format(way) for way in WAYS)], capture_output=True, check=False)
    medians = {way: statistics.median(times[way]) for way in WAYS}
    base = medians["without"]
    print(f"median ({'with' if probe else 'without'} the probe): "
          + ", ".join(f"{way} {m:.1f} s ({m / base:.2f}x)" for way, m in medians.items()))


if __name__ == "__main__":
    main()
