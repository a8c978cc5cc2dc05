"""Read the KV-cache figures out of a vLLM server log, per rank.

The message texts are vLLM's own (0.33.0 file:line; 0.30.0/0.31.0 print the same texts):
  v1/worker/gpu_worker.py:773      "Available KV cache memory: %s GiB"          (each worker)
  v1/core/kv_cache_utils.py:1148   "%s KV cache size: %s tokens, Maximum concurrency for %s
                                    tokens per request: %.2fx"                 (each EngineCore)
  v1/worker/gpu_model_runner.py:6410  "Estimated CUDA graph memory: %.2f GiB total"
  v1/worker/gpu_model_runner.py:6517  "Graph capturing finished in %.0f secs, took %.2f GiB"
  v1/worker/gpu/model_runner.py:1164  the same, from the V2 runner: once for the profiling capture
                                    (before the KV line) and once for the real one (after)
  v1/worker/gpu_worker.py:1004     "CUDA graph pool memory: %s GiB (actual), %s GiB (estimated), ..."
Older releases (the 0.9-0.11 line) logged the capacity as two lines, "GPU KV cache size: %s
tokens" and "Maximum concurrency for %s tokens per request: %.2fx"; both shapes are read.

Every line carries a process prefix somewhere before the level: 0.31+ put it in the log format
(logger.py `_FORMAT`: "(%(vllm_process_name)s pid=%(process)d) INFO 11-29 14:00:00 [file:line]
msg"), 0.30 wrote it onto stdout (utils/system_utils.py `_add_prefix`, cyan on a terminal), and
Ray prints "(RayWorkerWrapper pid=N, ip=A)". So nothing here anchors at the line start. The
names come from v1/executor/multiproc_executor.py:1214 ("Worker" + _DP/_PP/_PCP/_TP/_DCP/_EP
indices, each only when that size is > 1) and v1/engine/core.py:1478 ("EngineCore" or
"EngineCore_DP<n>"). A line without a prefix belongs to rank 0 of a single-process run.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import BadInput
from .model import EngineFigures, LineFormat, RankFigures, ServerLog

FLAG = "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DIM = r"(?:DP|PP|PCP|TP|DCP|EP)\d+"
# "(Worker_TP1 pid=7)", "(EngineCore_DP0 pid=7)", "(VllmWorker TP1 pid=7)" (0.10),
# "(VllmWorker rank=1 pid=7)" (0.8-0.9), "(EngineCore_0 pid=7)" (0.10), Ray's ", ip=..." suffix.
_PREFIX = re.compile(
    r"\((?P<name>[A-Za-z][A-Za-z0-9_]*)"
    r"(?:\s+rank=(?P<rank>\d+)|\s+(?P<dims>" + _DIM + r"(?:_" + _DIM + r")*))?"
    r"\s+pid=\d+(?:,\s*ip=[^)]*)?\)"
)
_INDEX = re.compile(r"(DP|PP|PCP|TP|DCP|EP)(\d+)")
_ENGINE_NUMBER = re.compile(r"^EngineCore_(\d+)$")
_NUM = r"(-?\d+(?:\.\d+)?)"

_KV_MEMORY = re.compile(r"Available KV cache memory:\s*" + _NUM + r"\s*GiB")
_CAPACITY_MERGED = re.compile(
    r"KV cache size:\s*([\d,]+)\s+tokens,\s*Maximum concurrency for\s+([\d,]+)\s+tokens per"
    r" request:\s*" + _NUM + "x"
)
_CAPACITY_TOKENS = re.compile(r"KV cache size:\s*([\d,]+)\s+tokens")
_GRAPH_ESTIMATE = re.compile(r"Estimated CUDA graph memory:\s*" + _NUM + r"\s*GiB total")
_GRAPH_CAPTURE = re.compile(r"Graph capturing finished in\s+\d+\s+secs?,\s*took\s+" + _NUM + r"\s*GiB")
_GRAPH_POOL = re.compile(
    r"CUDA graph pool memory:\s*" + _NUM + r"\s*GiB \(actual\),\s*" + _NUM + r"\s*GiB \(estimated\)"
)
# The patch's line names the flag and a MiB figure; its wording may change, the pair will not.
_OMITTED_MIB = re.compile(_NUM + r"\s*MiB")
# vllm/platforms/interface.py:1466 - an unpatched image does not know the variable.
_UNKNOWN_FLAG = re.compile(r"Unknown vLLM environment variable detected:\s*" + FLAG + r"\b")
# The server is up: launchers/launcher.py:188, launchers/api_server/entry.py:139, uvicorn.
_READY = re.compile(r"Available routes are:|Starting vLLM server on|Application startup complete")

def process_of(line: str) -> tuple[str, str]:
    """(rank label, engine label) of the process that wrote `line`.

    The rank label is the name's indices as vLLM writes them ("TP1", "PP0_TP0", "DP1_TP0"),
    "rank<N>" for the older "(VllmWorker rank=N pid=...)" and "rank0" for none at all.
    """
    match = _PREFIX.search(line)
    if match is None:
        return "rank0", "DP0"
    if match.group("rank") is not None:
        return f"rank{match.group('rank')}", "DP0"
    if number := _ENGINE_NUMBER.match(match.group("name")):
        return f"DP{number.group(1)}", f"DP{number.group(1)}"
    indices = _INDEX.findall(match.group("dims") or "")
    indices += [(d, n) for d, n in re.findall(r"_(DP|PP|PCP|TP|DCP|EP)(\d+)", match.group("name"))]
    rank = "_".join(f"{dim}{n}" for dim, n in indices) or "rank0"
    dp = next((n for dim, n in indices if dim == "DP"), "0")
    return rank, f"DP{dp}"


def parse_server_log(text: str, *, source: str) -> ServerLog:
    """Every KV-relevant figure of one server log, per rank and per engine."""
    ranks: dict[str, dict[str, float]] = {}
    engines: dict[str, dict[str, int]] = {}
    conflicts: list[str] = []
    capacity_format: LineFormat | None = None
    unknown_flag = ready = False

    def put(table: dict, key: str, name: str, value: float | int, kind: str) -> None:
        slot = table.setdefault(key, {})
        if name in slot and slot[name] != value:
            conflicts.append(
                f"{source}: {key} logged {kind} twice with different values "
                f"({slot[name]} and {value})"
            )
            return
        slot.setdefault(name, value)

    for raw in text.splitlines():
        line = _ANSI.sub("", raw)
        rank, engine = process_of(line)
        if m := _KV_MEMORY.search(line):
            put(ranks, rank, "kv_gib", float(m.group(1)), "'Available KV cache memory'")
        if m := _CAPACITY_MERGED.search(line):
            capacity_format = "merged"
            put(engines, engine, "tokens", _int(m.group(1)), "'KV cache size'")
        elif m := _CAPACITY_TOKENS.search(line):
            capacity_format = capacity_format or "separate"
            put(engines, engine, "tokens", _int(m.group(1)), "'KV cache size'")
        # Graph figures are information, not evidence: the latest line of each kind wins.
        if m := _GRAPH_ESTIMATE.search(line):
            ranks.setdefault(rank, {})["graph_estimate_gib"] = float(m.group(1))
        # A capture line before the rank's KV line is the V2 runner's profiling capture.
        if (m := _GRAPH_CAPTURE.search(line)) and "kv_gib" in ranks.get(rank, {}):
            ranks[rank]["graph_capture_gib"] = float(m.group(1))
        if m := _GRAPH_POOL.search(line):
            ranks.setdefault(rank, {})["graph_estimate_gib"] = float(m.group(2))
        if FLAG in line:
            if _UNKNOWN_FLAG.search(line):
                unknown_flag = True
            elif m := _OMITTED_MIB.search(line.split(FLAG, 1)[1]):
                put(ranks, rank, "omitted_mib", float(m.group(1)), f"the {FLAG} omission")
        if _READY.search(line):
            ready = True

    return ServerLog(
        source=source,
        ranks=tuple(
            RankFigures(rank=key, **values)
            for key, values in sorted(ranks.items(), key=lambda kv: rank_order(kv[0]))
        ),
        engines=tuple(
            EngineFigures(engine=key, **values)
            for key, values in sorted(engines.items(), key=lambda kv: rank_order(kv[0]))
        ),
        capacity_format=capacity_format,
        unknown_flag=unknown_flag,
        ready=ready,
        conflicts=tuple(conflicts),
    )


def read_server_log(path: Path) -> ServerLog:
    """Parse a log file; a file that cannot be read is bad input (exit 2)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise BadInput(f"cannot read server log {path}: {exc.strerror or exc}") from exc
    return parse_server_log(data.decode("utf-8", errors="replace"), source=str(path))


def _int(text: str) -> int:
    return int(text.replace(",", ""))


def rank_order(label: str) -> tuple:
    """Numeric order: TP2 before TP10, DP0_TP1 before DP1_TP0."""
    return tuple((part.rstrip("0123456789"), int(part[len(part.rstrip("0123456789")):] or 0))
                 for part in label.split("_"))
