"""Benchmark: what apply's check of the tree against the published wheel costs.

`apply` now checks the whole tree before it writes (pipeline/integrity_check.py: check_base:
every file against the shipped reference, every .pyc recompiled), while the probe started early warms up
in the same container. This runs `dspark-patch apply --image` on the fixture with the check and
without it (the same CLI with `check_base` replaced by a no-op, in a subprocess), alternately for
a few rounds, and prints each time, the medians and their ratio.

Run: .venv/bin/python bench/apply_base_check.py [ROUNDS]   (needs the engine and the fixture)
Not a test: timings vary with the machine; read the figures side by side.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = ROOT / ".venv" / "bin" / "python"
TAG = "dspark-patch/bench:base-check-{}"
WITHOUT = ("import sys; from dspark_patch.pipeline import commands; "
           "commands.check_base = lambda *a, **k: None; "
           "from dspark_patch.cli import main; sys.argv = ['dspark-patch', *sys.argv[1:]]; main()")
WITH = "import sys; from dspark_patch.cli import main; sys.argv = ['dspark-patch', *sys.argv[1:]]; main()"


def fixture() -> str:
    done = subprocess.run([str(ROOT / "scripts" / "build-images")], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"scripts/build-images failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())["vllm-fixture"]


def apply_seconds(ref: str, checked: bool, report_dir: Path) -> float:
    tag = TAG.format("on" if checked else "off")
    start = time.perf_counter()
    done = subprocess.run([str(PY), "-c", WITH if checked else WITHOUT, "apply", "--image", ref, "--pull", "never",
                           "--tag", tag, "--force", "--report-dir", str(report_dir)],
                          capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"apply ({'with' if checked else 'without'} the check) failed (exit {done.returncode}):\n"
                 f"{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    ref = fixture()
    times: dict[bool, list[float]] = {True: [], False: []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(rounds):
                for checked in (False, True):
                    seconds = apply_seconds(ref, checked, Path(tmp) / f"{i}-{checked}")
                    times[checked].append(seconds)
                    print(f"round {i + 1}: apply {'with' if checked else 'without'} the base check: {seconds:6.1f} s",
                          flush=True)
    finally:
        subprocess.run(["docker", "rmi", "-f", TAG.format("on"), TAG.format("off")], capture_output=True, check=False)
    off, on = statistics.median(times[False]), statistics.median(times[True])
    print(f"median: without {off:.1f} s, with {on:.1f} s, ratio {on / off:.2f}x")


if __name__ == "__main__":
    main()
