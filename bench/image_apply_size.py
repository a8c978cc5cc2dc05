"""Benchmark: does `apply --image` cost the same on a big image as on the fixture?

Serving images are 10-20 GB, mostly CUDA libraries below vLLM. The tool touches two files and
their bytecode, so its cost should not grow with what else the image holds. This runs
`dspark-patch apply --image` on the fixture (~2 GB) and on `big` — the same fixture built on a
~3 GB layer of 3,000 large and 100,000 small files (images/big, built by
`scripts/build-images --big`, once) — alternately for a few rounds, and prints each time, the
medians and their ratio (target: close to 1x).

Run: .venv/bin/python bench/image_apply_size.py [ROUNDS]   (needs the engine; builds `big` once)
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
TAG = "dspark-patch/bench:size-{}"


def built(big: bool) -> dict[str, str]:
    argv = [str(ROOT / "scripts" / "build-images"), *(["--big"] if big else [])]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"scripts/build-images failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return dict(line.split(" ", 1) for line in done.stdout.splitlines())


def apply_seconds(ref: str, name: str, report_dir: Path) -> float:
    start = time.perf_counter()
    done = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "dspark-patch"), "apply", "--image", ref, "--tag", TAG.format(name),
         "--force", "--report-dir", str(report_dir)],
        capture_output=True, text=True, check=False,
    )
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"dspark-patch apply on {ref} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def image_size(ref: str) -> tuple[int, int]:
    """(bytes, layers) of an image, as the engine reports them."""
    out = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}} {{len .RootFS.Layers}}", ref],
                         capture_output=True, text=True, check=True).stdout.split()
    return int(out[0]), int(out[1])


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    refs = built(big=True)
    subjects = {"fixture": refs["vllm-fixture"], "big": refs["big"]}
    for name, ref in subjects.items():
        size, layers = image_size(ref)
        print(f"{name:8} {ref}  {size / 1e9:.2f} GB in {layers} layers")
    times: dict[str, list[float]] = {name: [] for name in subjects}
    with tempfile.TemporaryDirectory(prefix="dspark-bench-size-") as tmp:
        for i in range(rounds):
            # Alternate, so drift on a shared machine lands on both sides alike.
            order = list(subjects) if i % 2 == 0 else list(reversed(subjects))
            for name in order:
                seconds = apply_seconds(subjects[name], name, Path(tmp) / f"{name}-{i}")
                times[name].append(seconds)
                print(f"round {i + 1}: {name:8} {seconds:6.1f} s")
    for name in subjects:
        subprocess.run(["docker", "rmi", "--force", TAG.format(name)], capture_output=True, check=False)
    fixture, big = (statistics.median(times[n]) for n in ("fixture", "big"))
    print(f"median: fixture {fixture:.1f} s, big {big:.1f} s, big/fixture {big / fixture:.2f}x")


if __name__ == "__main__":
    main()
