"""Apply the whole vLLM 0.30.0 -> 0.31.0 Python diff with our engine and with GNU patch; print both times.

    .venv/bin/python bench/patching_vs_gnu_patch.py [--rounds 5]

Ours is timed end to end as the CLI would run it: parse the diff, plan every file (reading the
tree), write the plan (temp file + os.replace per file), with each stage's share shown too.
GNU patch is `patch -p1 -F0 --batch` on the same diff in a copy of the same tree. Both results
are checked against the real 0.31.0 files, so a fast wrong answer cannot pass. The two run
alternately, N rounds each, on fresh copies; the best round of each is compared (the machine
may be shared, and the best is the one least disturbed by other work). CPU seconds (user +
system, of this process or of the `patch` child) are shown too: on a busy machine they say more
than the wall clock, which also counts the time spent waiting for a core.
"""

from __future__ import annotations

import argparse
import filecmp
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dspark_patch.patching import parse_diff, plan_patch  # noqa: E402
from dspark_patch.targets.fs import read_inside, write_plan  # noqa: E402
from tests.support import vllm  # noqa: E402

OLD, NEW = "0.30.0", "0.31.0"


def full_diff(sources: Path) -> bytes:
    # Run from the cache so the headers read "0.30.0/vllm/..." and -p1 leaves "vllm/...";
    # -N writes added and deleted files as diffs against an empty file ("-0,0" / "+0,0").
    done = subprocess.run(["diff", "-ruN", f"{OLD}/vllm", f"{NEW}/vllm"], cwd=sources, capture_output=True)
    assert done.returncode == 1, done.stderr
    return done.stdout


def same_tree(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    stack = [cmp]
    while stack:
        c = stack.pop()
        if c.left_only or c.right_only or c.diff_files or c.funny_files:
            return False
        _, mismatch, errors = filecmp.cmpfiles(c.left, c.right, c.common_files, shallow=False)
        if mismatch or errors:
            return False
        stack.extend(c.subdirs.values())
    return True


_STAGES = ("parse", "read", "plan", "write")


def _child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_ours(diff: bytes, tree: Path) -> tuple[float, float, dict[str, float]]:
    """Wall and CPU seconds, and the wall seconds of each stage (reading happens inside
    planning, timed apart)."""
    reading = 0.0

    def read(rel: str) -> bytes | None:
        nonlocal reading
        began = time.perf_counter()
        try:
            return read_inside(tree, rel)
        finally:
            reading += time.perf_counter() - began

    cpu = time.process_time()
    start = time.perf_counter()
    parsed = parse_diff(diff)
    parsed_at = time.perf_counter()
    plan = plan_patch(parsed, read)
    planned_at = time.perf_counter()
    write_plan(tree, plan)
    end = time.perf_counter()
    cpu = time.process_time() - cpu
    stages = {
        "parse": parsed_at - start,
        "read": reading,
        "plan": planned_at - parsed_at - reading,
        "write": end - planned_at,
    }
    return end - start, cpu, stages


def run_gnu(diff: bytes, tree: Path) -> tuple[float, float, dict[str, float]]:
    cpu = _child_cpu()
    start = time.perf_counter()
    subprocess.run(["patch", "-p1", "-F0", "--batch", "--no-backup-if-mismatch", "-s", "-d", str(tree)], input=diff, check=True)
    return time.perf_counter() - start, _child_cpu() - cpu, {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    old_root, new_root = vllm.python_sources(OLD), vllm.python_sources(NEW)
    diff = full_diff(old_root.parent)
    parsed = parse_diff(diff)
    files, hunks = len(parsed.files), sum(len(f.hunks) for f in parsed.files)
    del parsed

    times: dict[str, list[float]] = {"ours": [], "gnu": []}
    cpu_times: dict[str, list[float]] = {"ours": [], "gnu": []}
    stages: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as scratch:
        for round_no in range(args.rounds):
            # Alternate who goes first, so neither always runs right after the other's writes.
            order = (("ours", run_ours), ("gnu", run_gnu))
            for name, run in order if round_no % 2 == 0 else order[::-1]:
                tree = Path(scratch, f"{name}-{round_no}", "t")
                shutil.copytree(old_root / "vllm", tree / "vllm")
                total, cpu, parts = run(diff, tree)
                times[name].append(total)
                cpu_times[name].append(cpu)
                if parts:
                    stages.append(parts)
                if not same_tree(tree / "vllm", new_root / "vllm"):
                    raise SystemExit(f"{name}: the patched tree differs from vLLM {NEW}")

    best = times["ours"].index(min(times["ours"]))
    ours, gnu = min(times["ours"]), min(times["gnu"])
    print(f"diff vLLM {OLD} -> {NEW}: {len(diff) / 1e6:.1f} MB, {files} files, {hunks} hunks")
    print(f"{'':24}{'best':>8}  all rounds (s)")
    print(f"{'dspark-patch engine':24}{ours:8.3f}  {' '.join(f'{t:.3f}' for t in times['ours'])}")
    for stage in _STAGES:
        shown = " ".join(f"{s[stage]:.3f}" for s in stages)
        print(f"{'  ' + stage:24}{stages[best][stage]:8.3f}  {shown}")
    print(f"{'GNU patch -p1 -F0':24}{gnu:8.3f}  {' '.join(f'{t:.3f}' for t in times['gnu'])}")
    print(f"{'CPU: dspark-patch':24}{min(cpu_times['ours']):8.3f}  {' '.join(f'{t:.3f}' for t in cpu_times['ours'])}")
    print(f"{'CPU: GNU patch':24}{min(cpu_times['gnu']):8.3f}  {' '.join(f'{t:.3f}' for t in cpu_times['gnu'])}")
    print(f"ratio ours / GNU patch: {ours / gnu:.2f}x wall, {min(cpu_times['ours']) / min(cpu_times['gnu']):.2f}x CPU "
          f"(aim: within 4x); both trees equal vLLM {NEW}")
    print("(the stages under 'best' are those of ours' best round; 'plan' leaves out its time in 'read')")


if __name__ == "__main__":
    main()
