"""Benchmark: `dspark-patch apply --image` against the least a user could do by hand.

By hand means: a Dockerfile FROM the fixture image that COPYs the patched files in and
byte-compiles them (`docker build --no-cache`: a cached build would patch nothing), plus one
container start that imports torch (the smallest stand-in for our probe). Both start from the
same fixture image and patch set, alternately, ROUNDS times (default 5). Prints the median and
the fastest of each side and their ratio (target: at most 1.2x, on the medians), where each
side's time goes (ours: the audit report's step timings, plus the process's own start and
report writing; by hand: the build and the run), the machine's load, and the size of the layer
we commit against the bytes of the patched files plus their bytecode.

Run: .venv/bin/python bench/image_apply_vs_dockerfile.py [ROUNDS]   (needs the engine and fixture images)
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

from dspark_patch.patching.diff import parse_diff  # noqa: E402
from dspark_patch.patching.plan import plan_patch  # noqa: E402
from dspark_patch.targets.docker import DockerEngine  # noqa: E402
from tests.support import images, vllm  # noqa: E402

PATCH = ROOT / "patches" / "dspark-skip-mtp-buffer" / "vllm-0.33.0.patch"
SITE = "/usr/local/lib/python3.11/dist-packages"
OURS_TAG = "dspark-patch/bench:ours"
HAND_TAG = "dspark-patch/bench:by-hand"


def _timed(argv: list[str], **kwargs) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    return time.perf_counter() - start, done


def ours(fixture: str, report_dir: Path) -> tuple[float, dict]:
    seconds, done = _timed([str(ROOT / ".venv" / "bin" / "dspark-patch"), "apply", "--image", fixture,
                            "--tag", OURS_TAG, "--force", "--report-dir", str(report_dir)])
    if done.returncode != 0:
        sys.exit(f"dspark-patch apply failed (exit {done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}")
    return seconds, json.loads((report_dir / "audit.json").read_text())


def by_hand(fixture: str, context: Path) -> tuple[dict[str, float], int]:
    # The patched files come from the same plan, computed on the host from the real wheel's tree.
    tree = vllm.installed_tree("0.33.0")
    plan = plan_patch(parse_diff(PATCH.read_bytes(), strip=1),
                      lambda p: (tree / p).read_bytes() if (tree / p).is_file() else None)
    lines = [f"FROM {fixture}", "USER root"]
    payload = 0
    for file in plan.files:
        assert file.post is not None
        (context / file.path).parent.mkdir(parents=True, exist_ok=True)
        (context / file.path).write_bytes(file.post)
        payload += len(file.post)
        lines.append(f"COPY {file.path} {SITE}/{file.path}")
    targets = " ".join(f"{SITE}/{f.path}" for f in plan.files)
    lines += [f"RUN python3 -m py_compile {targets}", "USER vllm"]
    (context / "Dockerfile").write_text("\n".join(lines) + "\n")
    env = {**os.environ, "DOCKER_BUILDKIT": "0"}
    # --no-cache: every round builds (the second round would otherwise be two cache hits, 0.1 s).
    build_s, done = _timed(["docker", "build", "--no-cache", "--quiet", "--network", "none", "-t", HAND_TAG,
                            str(context)], env=env)
    if done.returncode != 0:
        sys.exit(f"docker build failed:\n{done.stderr[-3000:]}")
    probe_s, done = _timed(["docker", "run", "--rm", "--network", "none", "--entrypoint", "python3",
                            "-e", "CUDA_VISIBLE_DEVICES=", HAND_TAG, "-c", "import torch; torch.ones(1)"])
    if done.returncode != 0:
        sys.exit(f"importing torch in the hand-built image failed:\n{done.stderr[-3000:]}")
    return {"docker build": build_s, "docker run (torch)": probe_s}, payload


def added_bytes(engine: DockerEngine, ref: str, base: str) -> int:
    """Bytes of the layers `ref` has on top of `base` (history is newest first)."""
    history = engine.client.api.history(ref)
    added = len(history) - len(engine.client.api.history(base))
    return sum(int(entry["Size"]) for entry in history[:added])


def load() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[0] if Path("/proc/loadavg").is_file() else "?"


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    fixture = images.fixture_image()
    engine = DockerEngine()
    hand_runs: list[float] = []
    ours_runs: list[float] = []
    hand_steps: dict[str, list[float]] = {}
    our_steps: dict[str, list[float]] = {}
    reports: list[dict] = []
    loads = [load()]
    with tempfile.TemporaryDirectory() as tmp:
        # Alternately, so that a busy spell of a shared machine falls on both sides.
        for i in range(rounds):
            steps, payload = by_hand(fixture, Path(tmp) / f"context-{i}")
            hand_runs.append(sum(steps.values()))
            for name, seconds in steps.items():
                hand_steps.setdefault(name, []).append(seconds)
            wall, report = ours(fixture, Path(tmp) / f"report-{i}")
            ours_runs.append(wall)
            reports.append(report)
            for step in report["steps"]:
                our_steps.setdefault(step["name"], []).append(step["seconds"])
            # What the steps do not cover: the interpreter's start and imports, the report's files.
            our_steps.setdefault("(process start, report files)", []).append(
                wall - sum(step["seconds"] for step in report["steps"]))
            loads.append(load())
    try:
        ours_layer = added_bytes(engine, OURS_TAG, fixture)
        hand_layer = added_bytes(engine, HAND_TAG, fixture)
    finally:
        for tag in (OURS_TAG, HAND_TAG):
            engine.remove_image(tag, force=True)
    median = statistics.median
    ours_m, hand_m = median(ours_runs), median(hand_runs)
    print(f"fixture image                 {fixture}")
    print(f"rounds                        {rounds}, alternating (all: "
          f"{', '.join(f'{o:.2f}/{h:.2f}' for o, h in zip(ours_runs, hand_runs, strict=True))} s ours/by hand)")
    print(f"load average (1 min)          {' '.join(loads)}  (before the first round, then after each)")
    print(f"dspark-patch apply --image    {ours_m:7.2f} s median, {min(ours_runs):.2f} fastest "
          "(plan, hash checks, compile, layer, probe, commit)")
    print(f"Dockerfile COPY + py_compile  {hand_m:7.2f} s median, {min(hand_runs):.2f} fastest "
          "(docker build --no-cache + one run importing torch)")
    print(f"ratio ours / by hand          {ours_m / hand_m:7.2f}x medians (target <= 1.2x), "
          f"{min(ours_runs) / min(hand_runs):.2f}x fastest")
    print("where the time goes (medians, s):")
    for name, values in hand_steps.items():
        print(f"  by hand  {name:<30} {median(values):6.2f}")
    for name, values in our_steps.items():
        print(f"  ours     {name:<30} {median(values):6.2f}")
    print("  (our probe step is what is left of the probe after its early start: its interpreter, torch import"
          " and source compile overlap open target .. layer)")
    unused = [n for r in reports for n in r.get("notes", ()) if "started early" in n]
    print(f"probe started early           {'no: ' + unused[0] if unused else f'yes, in every round ({rounds})'}")
    print(f"patched files (post-images)   {payload:7d} bytes")
    print(f"our committed layer           {ours_layer:7d} bytes  (files + bytecode + folders)")
    print(f"by-hand layers (COPY + RUN)   {hand_layer:7d} bytes")
    print(f"our report status             {', '.join(sorted({r['status'] for r in reports}))}")


if __name__ == "__main__":
    main()
