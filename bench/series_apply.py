"""Benchmark: what does a series of three patch sets cost against one, in `apply --image`?

A team carries the DSpark set and two of its own: `team-envs` (requires DSpark; changes
vllm/envs.py, which DSpark changes too, and vllm/logger.py) and `team-extra` (adds a module).
The series is planned in memory, each set on the result of the ones before, and written as one
layer, so it should cost about what one set costs (aim: at most 1.1x). This applies the DSpark
set alone and the series of three to the fixture image, alternately for ROUNDS rounds (default
3), probe included, and prints each time, the medians and their ratio.

Run: .venv/bin/python bench/series_apply.py [ROUNDS]   (needs the engine and the fixture image)
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dspark_patch.patching.diff import parse_diff  # noqa: E402
from dspark_patch.patching.plan import plan_patch  # noqa: E402
from dspark_patch.patchset import resolve  # noqa: E402
from tests.support.images import fixture_image  # noqa: E402
from tests.support.team_sets import DSPARK, write_set  # noqa: E402
from tests.support.vllm import installed_tree  # noqa: E402

TAG = "dspark-patch/bench:series-{}"


def team_sets(folder: Path) -> None:
    """team-envs and team-extra, made on the 0.33.0 wheel's files with the DSpark set applied."""
    tree = installed_tree("0.33.0")
    shipped = resolve(DSPARK)
    plan = plan_patch(parse_diff(shipped.variant_for("0.33.0").diff), lambda p: (tree / p).read_bytes())
    envs = next(f.post for f in plan.files if f.path == "vllm/envs.py")
    assert envs is not None
    logger = (tree / "vllm/logger.py").read_bytes()
    write_set(folder, "team-envs", {"vllm/envs.py": (envs, envs + b"\nVLLM_TEAM_FLAG = 1\n"),
                                    "vllm/logger.py": (logger, logger + b"\n# team\n")}, requires=(DSPARK,))
    write_set(folder, "team-extra", {"vllm/team_extra.py": (None, b"TEAM = 1\n")})


def apply_seconds(patches: list[str], name: str, report_dir: Path, env: dict[str, str]) -> float:
    argv = [str(ROOT / ".venv" / "bin" / "dspark-patch"), "apply", "--image", fixture_image(),
            *(a for p in patches for a in ("--patch", p)), "--tag", TAG.format(name), "--force",
            "--report-dir", str(report_dir)]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env=env)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"apply of {patches} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with tempfile.TemporaryDirectory(prefix="dspark-bench-series-") as tmp:
        team_sets(Path(tmp) / "patches")
        env = {**os.environ, "DSPARK_PATCH_PATH": str(Path(tmp) / "patches")}
        sides = {"one": [DSPARK], "three": [DSPARK, "team-envs", "team-extra"]}
        times: dict[str, list[float]] = {name: [] for name in sides}
        for i in range(rounds):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))  # drift lands on both sides
            for name in order:
                seconds = apply_seconds(sides[name], name, Path(tmp) / f"{name}-{i}", env)
                times[name].append(seconds)
                print(f"round {i + 1}: {name:5} {seconds:6.1f} s  (load {os.getloadavg()[0]:.1f})")
    for name in sides:
        subprocess.run(["docker", "rmi", "--force", TAG.format(name)], capture_output=True, check=False)
    one, three = (statistics.median(times[n]) for n in ("one", "three"))
    print(f"median: one set {one:.1f} s, a series of three {three:.1f} s, three/one {three / one:.2f}x")


if __name__ == "__main__":
    main()
