"""Benchmark: `dspark-patch apply --platform all` on the two-platform fixture index.

Publishes the amd64 + arm64 fixture index into a fresh loopback registry (not timed), then
runs one `apply --platform all` (no push) and prints, per platform, the wall seconds of its
run (pull, emulation check, locate, plan, write, compile, probe, layer, commit) and, for the
emulated platform, the probe's share of it: the figure that says what running the probe under
qemu costs against doing the rest of the work.

Run: .venv/bin/python bench/platform_apply.py   (needs the engine, qemu binfmt, the fixtures)
Not a test: timings vary with the machine; read the figures side by side.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dspark_patch.report.render import read_report  # noqa: E402
from tests.support.index import fixture_index  # noqa: E402


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-platform-") as tmp:
        work = Path(tmp)
        print("publishing the fixture index (not timed)...", file=sys.stderr)
        with fixture_index(work / "registry") as index:
            reports = work / "reports"
            load_before = os.getloadavg()[0]
            start = time.perf_counter()
            done = subprocess.run([str(ROOT / ".venv" / "bin" / "dspark-patch"), "apply", "--image", index.ref,
                                   "--platform", "all", "--report-dir", str(reports)],
                                  capture_output=True, text=True)
            wall = time.perf_counter() - start
            load_after = os.getloadavg()[0]
            if done.returncode != 0:
                sys.exit(f"apply failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
            report = read_report(reports / "audit.json")
            # The committed images are untagged: remove them so the bench leaves nothing behind.
            for p in report.platforms:
                if p.report.result_image is not None:
                    subprocess.run(["docker", "rmi", p.report.result_image.id], capture_output=True, check=False)

    print(f"apply --platform all: {wall:.1f} s wall for {len(report.platforms)} platforms "
          f"(load {load_before:.1f} before, {load_after:.1f} after, {os.cpu_count()} cores)")
    print(f"{'platform':<16} {'seconds':>8} {'probe s':>8} {'probe share':>12}  emulated")
    for p in report.platforms:
        total = sum(s.seconds for s in p.report.steps)
        probe = sum(s.seconds for s in p.report.steps if s.name == "probe")
        share = probe / total if total else 0.0
        print(f"{p.platform:<16} {total:8.1f} {probe:8.1f} {share:12.0%}  {'yes' if p.emulated else 'no'}")
    # Where each platform's time goes, step by step (the probe step is what is left of the probe
    # after its early start: interpreter, torch import and the compile of its source overlap
    # locate .. layer).
    names = list(dict.fromkeys(s.name for p in report.platforms for s in p.report.steps))
    print(f"{'step':<16} " + " ".join(f"{p.platform:>16}" for p in report.platforms))
    for name in names:
        cells = [sum(s.seconds for s in p.report.steps if s.name == name) for p in report.platforms]
        print(f"{name:<16} " + " ".join(f"{c:16.1f}" for c in cells))
    for p in report.platforms:
        unused = [n for n in p.report.notes if "started early" in n]
        print(f"{p.platform}: probe started early: {'no: ' + unused[0] if unused else 'yes'}")
    native = [sum(s.seconds for s in p.report.steps) for p in report.platforms if not p.emulated]
    emulated = [sum(s.seconds for s in p.report.steps) for p in report.platforms if p.emulated]
    if native and emulated and native[0]:
        print(f"emulated platform: {emulated[0]:.1f} s (aim: at most 60 s), native {native[0]:.1f} s; "
              f"emulated / native platform time: {emulated[0] / native[0]:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
