"""TEST DOUBLE: stands in for a vLLM 0.33.0 server with TP2 in `evaluate` tests.

It prints what the real server prints about KV memory (format: vllm/logger.py `_FORMAT`, the
messages of v1/worker/gpu_worker.py:773, v1/core/kv_cache_utils.py:1148, and the patch's
omission line), with the figures measured on TP2 H100 NVL for flag off and flag on. The flag
decides the figures, as the patched vLLM would. KVLOG_DOUBLE_MODE=one-rank makes only rank 0
log the omission (a broken patch); =no-kv stops before the KV lines (a crashed server).
"""

import os
import signal
import sys
import time

signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
FLAG = "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER"
mode = os.environ.get("KVLOG_DOUBLE_MODE", "normal")
on = os.environ.get(FLAG) == "1"


def log(process: str, pid: int, where: str, message: str) -> None:
    print(f"({process} pid={pid}) INFO 11-29 14:00:00 [{where}] {message}", flush=True)


print("TEST-DOUBLE args: " + " ".join(sys.argv[1:]))
for key in sorted(os.environ):
    print(f"TEST-DOUBLE env: {key}={os.environ[key]}")
log("APIServer", 1, "utils.py:253", f"non-default args: {sys.argv[1:]}")
log("EngineCore", 40, "core.py:112", "Initializing a V1 LLM engine (v0.33.0) with config: tensor_parallel_size=2")
if on:
    for rank, pid in ((1, 61), (0, 60)):
        if mode == "one-rank" and rank == 1:
            continue
        log(f"Worker_TP{rank}", pid, "model.py:946",
            f"{FLAG}=1: skipped _mtp_hidden_buffer (4096 x 16384, torch.bfloat16): "
            "128.00 MiB not allocated on this rank")
if mode == "no-kv":
    print("RuntimeError: CUDA out of memory (TEST-DOUBLE crash)", flush=True)
    sys.exit(1)
kv, tokens, conc = ("6.89", "1,150,350", "8.78x") if on else ("6.76", "1,129,474", "8.62x")
log("Worker_TP0", 60, "gpu_worker.py:773", f"Available KV cache memory: {kv} GiB")
log("Worker_TP1", 61, "gpu_worker.py:773", f"Available KV cache memory: {kv} GiB")
log("EngineCore", 40, "kv_cache_utils.py:1148",
    f"GPU KV cache size: {tokens} tokens, Maximum concurrency for 131,072 tokens per request: {conc}")
log("Worker_TP1", 61, "model_runner.py:1164", "Graph capturing finished in 19 secs, took 0.61 GiB")
log("Worker_TP0", 60, "model_runner.py:1164", "Graph capturing finished in 19 secs, took 0.61 GiB")
log("APIServer", 1, "launcher.py:188", "Available routes are:")
while True:
    time.sleep(3600)
