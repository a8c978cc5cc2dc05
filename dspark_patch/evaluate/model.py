"""Frozen results of the evaluation commands: `estimate`, `kv-compare` and `evaluate`.

Each result is built once and rendered by the CLI; its JSON document is the dataclass through
the shared encoder (`dspark_patch.serialise`). Every document carries a `schema` string so a
reader can tell the shapes apart and notice a change of shape.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ESTIMATE_SCHEMA = "dspark-patch/estimate/v1"
KV_COMPARE_SCHEMA = "dspark-patch/kv-compare/v1"
# v2: `runs[].env` values and `runs[].args` values are redacted unless known safe
# (evaluate/redact.py), and `redacted_env` / `redacted_args` say which.
EVALUATION_SCHEMA = "dspark-patch/evaluation/v2"

Verdict = Literal["pass", "fail"]
FlagState = Literal["off", "on"]


@dataclass(frozen=True, kw_only=True)
class OmissionEstimate:
    """The bytes the patch leaves unallocated: tokens x hidden x hc_mult x dtype size (per GPU)."""

    tokens: int                     # rows of _mtp_hidden_buffer = max_num_batched_tokens
    hidden: int                     # hidden_size
    hc_mult: int                    # DeepSeek-V4 hyper-connection multiplier (config `hc_mult`)
    dtype: str                      # "bfloat16" | "float16" | "float32"
    dtype_bytes: int
    bytes: int
    mib: float
    kv_bytes_per_token: int | None = None   # per rank, when given
    refund_tokens: int | None = None        # bytes // kv_bytes_per_token
    config: str | None = None               # the config.json read, if any
    schema: str = ESTIMATE_SCHEMA


@dataclass(frozen=True, kw_only=True)
class RankFigures:
    """What one rank (one worker process) of one server log says."""

    rank: str                            # "TP1", "PP0_TP0", "DP1", "rank0" (no prefix / no index)
    kv_gib: float | None = None          # "Available KV cache memory: X GiB"
    omitted_mib: float | None = None     # the patch's omission line
    # Graph memory. The KV budget subtracts the profiling estimate ("Estimated CUDA graph
    # memory: X GiB total" in the V1 runner, "(estimated)" of the pool line in both runners);
    # the V2 runner's profiling capture also logs "Graph capturing finished ..., took X GiB"
    # before the KV line, the real capture logs it again after.
    graph_estimate_gib: float | None = None
    graph_capture_gib: float | None = None    # the capture line after the KV line: the final graphs


@dataclass(frozen=True, kw_only=True)
class EngineFigures:
    """What one engine (one data-parallel rank's EngineCore) says about KV capacity."""

    engine: str                          # "DP0", "DP1"
    tokens: int | None = None            # "GPU KV cache size: N tokens"


LineFormat = Literal["merged", "separate"]


@dataclass(frozen=True, kw_only=True)
class ServerLog:
    """The KV-relevant facts parsed out of one vLLM server log."""

    source: str                          # file name or description, for messages
    ranks: tuple[RankFigures, ...] = ()
    engines: tuple[EngineFigures, ...] = ()
    capacity_format: LineFormat | None = None   # 0.30+ merged line, or older separate lines
    unknown_flag: bool = False           # vLLM said the flag is an unknown variable: image unpatched
    ready: bool = False                  # a server-ready line was seen
    conflicts: tuple[str, ...] = ()      # the same figure logged twice with different values


@dataclass(frozen=True, kw_only=True)
class RankComparison:
    rank: str
    kv_gib_off: float | None
    kv_gib_on: float | None
    delta_gib: float | None
    omitted_mib_off: float | None
    omitted_mib_on: float | None
    expected_delta_gib: float | None     # omitted_mib_on / 1024, what the refund should be
    graph_estimate_gib_off: float | None = None
    graph_estimate_gib_on: float | None = None
    graph_capture_gib_off: float | None = None
    graph_capture_gib_on: float | None = None
    ok: bool


@dataclass(frozen=True, kw_only=True)
class EngineComparison:
    engine: str
    tokens_off: int | None
    tokens_on: int | None
    delta_tokens: int | None


@dataclass(frozen=True, kw_only=True)
class KvComparison:
    off_log: str
    on_log: str
    tokens_off: int | None               # summed over engines (one per data-parallel rank)
    tokens_on: int | None
    delta_tokens: int | None
    delta_pct: float | None
    kv_gib_off: float | None             # smallest rank figure: the one that bounds the cache
    kv_gib_on: float | None
    omission_ranks_off: tuple[str, ...]
    omission_ranks_on: tuple[str, ...]
    expected_delta_tokens: int | None    # omitted bytes / (off run's KV bytes per token)
    tolerance_gib: float
    ranks: tuple[RankComparison, ...]
    engines: tuple[EngineComparison, ...]
    verdict: Verdict
    reasons: tuple[str, ...]             # why it failed; empty on pass
    notes: tuple[str, ...] = ()          # observations that do not decide the verdict
    schema: str = KV_COMPARE_SCHEMA

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"


@dataclass(frozen=True, kw_only=True)
class ServerRunLog:
    """One of the two server starts of `evaluate`."""

    flag: FlagState
    flag_value: str                      # the value given to VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER
    image_id: str
    container_id: str
    env: tuple[tuple[str, str], ...]     # every name passed to the container, sorted; values as recorded
    args: tuple[str, ...]                # as recorded: values not known safe are "***"
    exit_code: int | None
    ready: bool                          # the stop condition was met before the timeout
    log_file: str


@dataclass(frozen=True, kw_only=True)
class EvaluationResult:
    image_ref: str
    image_id: str
    gpus: bool
    timeout_s: float
    runs: tuple[ServerRunLog, ServerRunLog]   # (off, on)
    comparison: KvComparison
    report_dir: str
    report_file: str
    verdict: Verdict
    reasons: tuple[str, ...]
    notes: tuple[str, ...] = ()          # how each run ended (timeout, exit) and the comparison's notes
    # What the record leaves out (evaluate/redact.py): the --env variables whose values are
    # "***", and per redacted argument the option it is the value of (or "argument N").
    redacted_env: tuple[str, ...] = ()
    redacted_args: tuple[str, ...] = ()
    schema: str = EVALUATION_SCHEMA

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"
