"""Benchmark: where a probe run's time goes, per platform: interpreter start, torch import,
loading the probe's source, the census (the walk over every vLLM module), the other cases.

Each phase runs in a container of the fixture image of that platform (arm64 under qemu), with
the image's own interpreter and torch, on the image's own (unpatched) vLLM tree: the walk and
the cases cost the same whether they pass or fail. Side by side in one run, native first.

Run: .venv/bin/python bench/probe_phases.py   (needs the engine, qemu binfmt, both fixtures)
Not a test: timings vary with the machine; read the figures side by side.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dspark_patch.patchset import resolve  # noqa: E402
from dspark_patch.probe.run import bundle  # noqa: E402
from tests.support import images  # noqa: E402
from tests.support.index import arm64_fixture_image  # noqa: E402

PATCH_SET = resolve("dspark-skip-mtp-buffer")
assert PATCH_SET.probe is not None

# Runs in the image: the probe loaded as a module (not run), its census timed on its own.
PHASES = """
import json, sys, time, types
from pathlib import Path
t = time.perf_counter
t0 = t(); import torch; t1 = t()
import importlib.abc, importlib.util
SOURCES = json.loads(sys.argv[3])  # the probe's own modules, importable by name as the runner's bundle makes them
class Modules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        return importlib.util.spec_from_loader(fullname, self) if fullname in SOURCES else None
    def create_module(self, spec):
        return None
    def exec_module(self, module):
        exec(compile(SOURCES[module.__name__], module.__name__ + ".py", "exec", dont_inherit=True), module.__dict__)
sys.meta_path.insert(0, Modules())
probe = types.ModuleType("probe"); probe.__dict__["__name__"] = "probe"
sys.modules["probe"] = probe
exec(compile(sys.argv[2], "probe.py", "exec", dont_inherit=True), probe.__dict__); t2 = t()
census = [0.0]
inner = probe.run_census
def timed(*a, **k):
    s = t(); r = inner(*a, **k); census[0] += t() - s; return r
probe.run_census = timed
import gc; gc.disable()  # as the probe's main() runs its cases
cases, refs = probe.run_cases(Path(sys.argv[1]), torch); t3 = t()
print(json.dumps({"torch": t1 - t0, "load": t2 - t1, "census": census[0], "cases": t3 - t2 - census[0],
                  "n": len(cases)}))
"""


def _docker(*args: str, ok: tuple[int, ...] = (0,)) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True)
    if done.returncode not in ok:
        sys.exit(f"docker {args[0]} failed: {done.stderr[-2000:]}")
    return done.stdout


def phases(image: str) -> dict[str, float]:
    # vllm's location from its spec origin, without importing it (find_spec reads no vllm code).
    site = _docker("run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-B", "-c",
                   "import importlib.util, os; s = importlib.util.find_spec('vllm'); "
                   "print(os.path.dirname(os.path.dirname(s.origin)))").strip().splitlines()[-1]
    cid = _docker("run", "-d", "--network", "none", "--entrypoint", "python3", image, "-c",
                  "import time; time.sleep(3600)").strip()
    try:
        def run(*argv: str) -> tuple[float, str]:
            start = time.perf_counter()
            # The unpatched tree fails the probe's cases (exit 1): its verdict is not the point here.
            out = _docker("exec", "-e", "CUDA_VISIBLE_DEVICES=", "-e", "PYTHONDONTWRITEBYTECODE=1", cid, *argv, ok=(0, 1))
            return time.perf_counter() - start, out

        start_s, _ = run("python3", "-B", "-c", "pass")
        modules = json.dumps({m.stem: m.read_text() for m in PATCH_SET.probe_modules})
        whole_s, out = run("python3", "-B", "-c", PHASES, site, PATCH_SET.probe.read_text(), modules)
        inside = json.loads(out.strip().splitlines()[-1])
        probe_s, _ = run("python3", "-B", "-c", bundle(PATCH_SET.probe, PATCH_SET.probe_modules), "--site", site, "--json")
    finally:
        _docker("rm", "-f", cid)
    return {"start": start_s, **inside, "whole": whole_s, "probe": probe_s}


def main() -> None:
    rows = [("linux/amd64", images.fixture_image()), ("linux/arm64 (qemu)", arm64_fixture_image())]
    results = [(name, phases(image)) for name, image in rows]
    print(f"{'platform':<20} {'start':>7} {'torch':>7} {'load':>7} {'census':>7} {'cases':>7} {'probe run':>10}")
    for name, r in results:
        print(f"{name:<20} {r['start']:7.2f} {r['torch']:7.2f} {r['load']:7.2f} {r['census']:7.2f} "
              f"{r['cases']:7.2f} {r['probe']:10.2f}")
    (_, native), (_, emulated) = results
    print("seconds; start = `python3 -B -c pass` through docker exec; probe run = the probe itself, as apply runs it")
    for key in ("start", "torch", "census", "cases", "probe"):
        if native[key] > 0:
            print(f"  {key:<8} emulated / native {emulated[key] / native[key]:6.1f}x")


if __name__ == "__main__":
    main()
