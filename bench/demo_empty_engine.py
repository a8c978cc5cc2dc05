"""`scripts/demo` as a newcomer runs it: a fresh clone, no virtualenv, an engine with no images.

The engine is a second dockerd with its own, empty data root (scripts/ensure-remote-docker with
its folders and port moved aside), so the development engine and its images are left alone. The
clone has no `.venv`: the demo's own set-up makes it. What stays cached is what a machine that
ran the project before keeps outside the engine: pip's cache, the vLLM wheel and the Debian
rootfs tarball in $DSPARK_PATCH_CACHE. It prints the demo's wall time, where it went (the
set-up, the image build, apply and verify), the load before and after, and the 5-minute aim.

    .venv/bin/python bench/demo_empty_engine.py
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
AIM_S = 300.0


def _load() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def main() -> int:
    work = Path(tempfile.mkdtemp(prefix="dspark-demo-bench-"))
    state, exec_root = work / "engine-data", Path("/run") / work.name
    env = {**os.environ, "DSPARK_PATCH_REMOTE_DOCKER_PORT": "23771", "DSPARK_PATCH_REMOTE_DOCKER_DIR": str(state),
           "DSPARK_PATCH_REMOTE_DOCKER_EXEC": str(exec_root),
           "DSPARK_PATCH_REMOTE_DOCKER_LOG": str(work / "dockerd.log")}
    try:
        host = subprocess.run([str(ROOT / "scripts/ensure-remote-docker")], env=env, check=True, text=True,
                              capture_output=True).stdout.strip()
        images = subprocess.run(["docker", "images", "-q"], env={**env, "DOCKER_HOST": host}, check=True,
                                text=True, capture_output=True).stdout.split()
        if images:
            print(f"the bench's engine is not empty ({len(images)} images)", file=sys.stderr)
            return 3
        clone = work / "clone"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
        before = _load()
        started = time.monotonic()
        done = subprocess.run(["bash", "scripts/demo"], cwd=clone, env={**env, "DOCKER_HOST": host},
                              text=True, capture_output=True)
        wall = time.monotonic() - started
        log = done.stdout + done.stderr
        if done.returncode != 0:
            print(log[-3000:], file=sys.stderr)
            print(f"scripts/demo failed (exit {done.returncode})", file=sys.stderr)
            return 1
        built = re.search(r"build-images: \[(\d+)s\] built dspark-patch/vllm-fixture", log)
        steps = sum(float(s) for s in re.findall(r"step [^:]+: ok \(([\d.]+)s\)", log))
        print(f"scripts/demo on an engine with no images: {wall:.1f} s (aim {AIM_S:.0f} s: "
              f"{'met' if wall < AIM_S else 'NOT met'}); load {before} before, {_load()} after")
        print(f"  build-images --fixture: {built.group(1) if built else '?'} s after it started; "
              f"apply and verify steps: {steps:.1f} s; the rest is the virtualenv and the processes' start")
        return 0
    finally:
        pidfile = exec_root / "dockerd.pid"
        if pidfile.is_file():
            try:
                os.kill(int(pidfile.read_text().strip()), signal.SIGTERM)
            except (ProcessLookupError, ValueError):
                pass
            for _ in range(30):
                if not (exec_root / "docker.sock").exists():
                    break
                time.sleep(1)
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(exec_root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
