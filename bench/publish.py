"""Benchmark: `publish` (no engine) against `apply --image --push` for the same source.

A loopback registry behind a login (tests/support/registry.py) holds the official-shape 0.33.0
image as team/vllm:0.33.0. The daemonless path is the CI job inside that image (a container of
it, the tool mounted read-only: `python3 -m dspark_patch apply --root SITE --layer-out FILE`),
then `publish` with DOCKER_HOST pointing at nothing, once with a cold scan cache and once with
the cache the cold run left. The engine path is `apply --image --tag … --push` of the same local
image. Both push into team/vllm, where the source's layers already are, so neither has to upload
them. The two sides alternate for ROUNDS rounds (default 3).

It prints, side by side from one run:
- the bytes `publish` sent (its own count of blob bodies: the gzip layer and the config) against
  the new layer's size, the tar the job wrote (aim: at most 1.05x), and the blobs each side
  uploaded (the registry's access log; a warm publish finds the layer's blob, gzip'd with no
  timestamp, already there);
- the median time of each side, and their ratios: publish cold and warm against apply --push,
  and the whole daemonless path (job + cold publish) against apply --push.

Run: .venv/bin/python bench/publish.py [ROUNDS]   (needs the engine: the job runs in a container)
Not a test: timings vary with the machine; read the figures side by side.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.support.images import official_image  # noqa: E402
from tests.support.registry import login_registry_in, push_only_to_registry  # noqa: E402
from tests.support.tool_folder import tool_folder  # noqa: E402

CLI = str(ROOT / ".venv" / "bin" / "dspark-patch")
SITE = "/usr/local/lib/python3.11/dist-packages"
USER, PASSWORD = "bench", "bench-password"
NO_ENGINE = "tcp://127.0.0.1:9"
# distribution's access log: a blob upload's last request names its digest
_UPLOAD = re.compile(r'"PUT /v2/\S+/blobs/uploads/\S+digest=(sha256(?::|%3A)[0-9a-f]{64})\S* HTTP/[0-9.]+" 201 ')


def uploads(log: Path, since: int) -> int:
    """The blob uploads the registry completed since byte `since` of its log."""
    return len(_UPLOAD.findall(log.read_bytes()[since:].decode("utf-8", "replace")))


def timed(argv: list[str], env: dict[str, str] | None = None) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(env or {})}, check=False)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(argv[:3])} failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    return seconds, done


def job(tool: Path, out: Path, source: str) -> float:
    """The in-image CI job: the tool from a read-only folder, the image's own python; networking off."""
    out.mkdir(parents=True)
    out.chmod(0o777)
    seconds, _ = timed(["docker", "run", "--rm", "--network", "none", "--user", "0", "-v", f"{tool}:/opt/t:ro",
                        "-v", f"{out}:/out", "-e", "PYTHONPATH=/opt/t", "--entrypoint", "python3", source,
                        "-m", "dspark_patch", "apply", "--root", SITE, "--layer-out", "/out/layer.tar",
                        "--report-dir", "/out/r"])
    return seconds


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    source_local = official_image()
    applied: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        tool = tool_folder(work / "tool")
        try:
            with login_registry_in(work, USER, PASSWORD) as (address, config, log):
                source = f"{address}/team/vllm:0.33.0"
                push_only_to_registry(source_local, source, config)
                # The engine's side pulls it, as a CI job would: the engine then knows the source's
                # layers are in the registry, and its push uploads only the new one.
                subprocess.run(["docker", "--config", str(config), "pull", "-q", source], check=True,
                               capture_output=True)
                applied.append(source)
                env = {"DOCKER_HOST": NO_ENGINE, "DOCKER_CONFIG": str(config)}
                rows: dict[str, list[float]] = {"job": [], "publish cold": [], "publish warm": [], "apply --push": []}
                counts: dict[str, int] = {}
                sent: dict[str, int] = {}
                layer_size = 0
                for i in range(rounds):
                    out = work / f"job{i}"
                    rows["job"].append(job(tool, out, source_local))
                    layer_size = (out / "layer.tar").stat().st_size
                    cache = work / f"cache{i}"
                    for label, tag in (("publish cold", f"c{i}"), ("publish warm", f"w{i}")):
                        since = log.stat().st_size
                        seconds, done = timed([CLI, "publish", "--image", source, "--layer", str(out / "layer.tar"),
                                               "--report", str(out / "r/audit.json"), "--tag",
                                               f"{address}/team/vllm:{tag}", "--json"],
                                              {**env, "DSPARK_PATCH_CACHE": str(cache)})
                        rows[label].append(seconds)
                        counts[label] = uploads(log, since)
                        sent[label] = json.loads(done.stdout)["sent"]["bytes"]
                    tag = f"{address}/team/vllm:a{i}"
                    since = log.stat().st_size
                    seconds, _ = timed([CLI, "apply", "--image", source, "--pull", "never", "--tag", tag, "--push",
                                        "--report-dir", str(work / f"apply{i}")], {"DOCKER_CONFIG": str(config)})
                    applied.append(tag)
                    rows["apply --push"].append(seconds)
                    counts["apply --push"] = uploads(log, since)
                    shutil.rmtree(cache)
        finally:
            if applied:   # the tags apply made, and the pulled source
                subprocess.run(["docker", "rmi", "-f", *applied], capture_output=True, check=False)
    med = {label: statistics.median(values) for label, values in rows.items()}
    for label, values in rows.items():
        print(f"{label:<14} median {med[label]:6.2f}s   runs: {', '.join(f'{v:.2f}' for v in values)}"
              + (f"   blobs uploaded: {counts[label]}" if label in counts else ""))
    print(f"publish (cold) sent {sent['publish cold']:,} bytes; the new layer (tar) is {layer_size:,} bytes: "
          f"{sent['publish cold'] / layer_size:.2f}x (aim: <= 1.05x); warm, the layer's blob already there: "
          f"{sent['publish warm']:,} bytes")
    push = med["apply --push"]
    print(f"publish cold / apply --push {med['publish cold'] / push:5.2f}x   publish warm / apply --push "
          f"{med['publish warm'] / push:5.2f}x   job + publish cold / apply --push "
          f"{(med['job'] + med['publish cold']) / push:5.2f}x")


if __name__ == "__main__":
    main()
