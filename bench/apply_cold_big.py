"""Benchmark: a cold `apply --image` on the official shape, and on the same image over +10 GB of
lower layers, side by side, against the hand floor.

The images: `dspark-patch/vllm-official:0.33.0` (uv, no bytecode, USER 2000, `vllm serve`; 2.3 GB)
and `dspark-patch/big-official:0.33.0`, the same Dockerfile on a bulk layer of 10,240 files of
1 MiB and 100,000 of 1 KiB of incompressible bytes (images/big; `scripts/build-images --big-official`).

- cold: `apply --image X --tag T --force` (probe included) with an empty `$DSPARK_PATCH_CACHE`
  (a new folder per run: no scan, no kept answer, no proof);
- warm: the same again, with the cache the cold run left;
- by hand: a Dockerfile FROM X that COPYs the patched files and compiles them with the image's
  python (`docker build --no-cache`), and then the same plus one container start that imports
  torch (the smallest stand-in for our probe).
- with `--strict`, also a cold `apply --strict-layers` of each (every layer read by the strict
  layer reader: one save of the whole image; what apply did by default before).

Rounds (default 3) alternate the order of the images. Before each timed run the bench waits (at
most 30 s) for a quiet machine. Prints every time, the medians and the ratios: big / small cold
(aim at most 1.5x) and warm (aim at most 1.15x), and ours / by hand.

Run: .venv/bin/python bench/apply_cold_big.py [ROUNDS] [--strict]   (needs scripts/build-images --big-official)
Not a test: timings vary with the machine; read the figures side by side.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from status_fleet import SETTLED, settle  # noqa: E402

from dspark_patch.patching.diff import parse_diff  # noqa: E402
from dspark_patch.patching.plan import plan_patch  # noqa: E402
from tests.support import images, vllm  # noqa: E402

PATCH = ROOT / "patches" / "dspark-skip-mtp-buffer" / "vllm-0.33.0.patch"
SITE = "/usr/local/lib/python3.11/dist-packages"
BIG = "dspark-patch/big-official:0.33.0"
TAG = "dspark-patch/bench-cold:{}"


def _seconds(argv: list[str], env: dict[str, str] | None = None) -> float:
    settle()
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} … failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    return seconds


def ours(image: str, name: str, cache: Path, report: Path, *extra: str) -> tuple[float, dict]:
    env = {**os.environ, "DSPARK_PATCH_CACHE": str(cache)}
    seconds = _seconds([str(ROOT / ".venv" / "bin" / "dspark-patch"), "apply", "--image", image, "--pull", "never",
                        "--tag", TAG.format(name), "--force", *extra, "--report-dir", str(report)], env)
    return seconds, json.loads((report / "audit.json").read_text())


def hand_context(context: Path) -> None:
    """The patched files, from the same plan on the real wheel's tree, and a Dockerfile for `FROM`."""
    tree = vllm.installed_tree("0.33.0")
    plan = plan_patch(parse_diff(PATCH.read_bytes(), strip=1),
                      lambda p: (tree / p).read_bytes() if (tree / p).is_file() else None)
    lines = ["ARG BASE", "FROM ${BASE}", "USER root"]
    for file in plan.files:
        assert file.post is not None
        (context / file.path).parent.mkdir(parents=True, exist_ok=True)
        (context / file.path).write_bytes(file.post)
        lines.append(f"COPY {file.path} {SITE}/{file.path}")
    lines += [f"RUN python3 -m py_compile {' '.join(f'{SITE}/{f.path}' for f in plan.files)}", "USER 2000"]
    (context / "Dockerfile").write_text("\n".join(lines) + "\n")


def by_hand(image: str, name: str, context: Path) -> tuple[float, float]:
    """(docker build --no-cache, one run importing torch) in seconds."""
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    build = _seconds(["docker", "build", "--no-cache", "--quiet", "--network", "none", "--build-arg", f"BASE={image}",
                      "-t", TAG.format(f"hand-{name}"), str(context)], env)
    run = _seconds(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3", "-e",
                    "CUDA_VISIBLE_DEVICES=", TAG.format(f"hand-{name}"), "-c", "import torch; torch.ones(1)"])
    return build, run


def _size(image: str) -> float:
    done = subprocess.run(["docker", "image", "inspect", "-f", "{{.Size}}", image], capture_output=True, text=True,
                          check=True)
    return int(done.stdout) / 1e9


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    rounds = int(args[0]) if args else 3
    strict = "--strict" in sys.argv
    sides = {"small": images.official_image(), "big": BIG}
    for image in sides.values():
        if subprocess.run(["docker", "image", "inspect", image], capture_output=True).returncode != 0:
            sys.exit(f"no image {image}: run scripts/build-images --big-official first")
    times: dict[str, list[float]] = {}
    steps: dict[str, dict[str, list[float]]] = {}

    def keep(key: str, seconds: float, report: dict | None = None) -> None:
        times.setdefault(key, []).append(seconds)
        for step in (report or {}).get("steps", ()):
            steps.setdefault(key, {}).setdefault(step["name"], []).append(step["seconds"])

    with tempfile.TemporaryDirectory(prefix="dspark-bench-cold-") as tmp:
        work = Path(tmp)
        hand_context(work / "context")
        for i in range(rounds):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for name in order:
                image, cache = sides[name], work / f"cache-{name}-{i}"
                cold, report = ours(image, name, cache, work / f"cold-{name}-{i}")
                keep(f"{name} cold", cold, report)
                warm, report = ours(image, name, cache, work / f"warm-{name}-{i}")
                keep(f"{name} warm", warm, report)
                build, run = by_hand(image, name, work / "context")
                keep(f"{name} hand build", build)
                keep(f"{name} hand build+run", build + run)
                line = f"round {i + 1}: {name:5} cold {cold:6.1f} s, warm {warm:6.1f} s, by hand {build:5.1f} s + {run:4.1f} s"
                if strict:
                    seconds, report = ours(image, name, work / f"strict-{name}-{i}", work / f"strict-{name}-{i}-r",
                                           "--strict-layers")
                    keep(f"{name} cold --strict-layers", seconds, report)
                    line += f", cold --strict-layers {seconds:6.1f} s"
                print(f"{line}  (load {os.getloadavg()[0]:.1f})", flush=True)
    for name in sides:
        for tag in (TAG.format(name), TAG.format(f"hand-{name}")):
            subprocess.run(["docker", "rmi", "--force", tag], capture_output=True, check=False)
    med = {key: statistics.median(values) for key, values in times.items()}
    print(f"images: small {sides['small']} ({_size(sides['small']):.1f} GB), big {BIG} ({_size(BIG):.1f} GB)")
    for key, value in med.items():
        print(f"median {key:<28} {value:7.2f} s")
    print(f"big / small, cold                    {med['big cold'] / med['small cold']:5.2f}x  (aim <= 1.5x)")
    print(f"big / small, warm                    {med['big warm'] / med['small warm']:5.2f}x  (aim <= 1.15x)")
    for name in sides:
        print(f"{name}: cold apply / hand build         {med[f'{name} cold'] / med[f'{name} hand build']:5.2f}x, "
              f"/ hand build+run {med[f'{name} cold'] / med[f'{name} hand build+run']:5.2f}x")
    if strict:
        print(f"big / small, cold --strict-layers    "
              f"{med['big cold --strict-layers'] / med['small cold --strict-layers']:5.2f}x")
    for key in ("small cold", "big cold"):
        top = sorted(((statistics.median(v), n) for n, v in steps.get(key, {}).items()), reverse=True)[:6]
        print(f"{key} steps (medians): " + ", ".join(f"{n} {s:.1f}" for s, n in top))
    print(f"waited for a quiet machine before the timed runs: {SETTLED[0]:.1f} s in all (not counted)")


if __name__ == "__main__":
    main()
