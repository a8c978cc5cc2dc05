"""The verdict on a flag-off / flag-on pair of server logs.

Pass only when all of these hold:
  * every figure is there: each rank's "Available KV cache memory" in both logs, each engine's
    "KV cache size: N tokens" in both logs (a missing one is named: file, line kind, rank);
  * the omission line appears on every rank of the enabled run and on none of the disabled run;
  * the token capacity did not drop (per engine and in total);
  * each rank's KV memory rose by what that rank says it omitted, within the logs' rounding:
    vLLM prints GiB rounded to 2 decimals (utils/mem_utils.py `format_gib`), so each figure is
    off by up to 0.005 GiB and a difference of two by up to 0.01 GiB (the default tolerance).
Graph memory is reported per rank; a change there is a note, because it already shows in the
KV memory (vLLM subtracts its graph estimate from the KV budget, v1/worker/gpu_worker.py:753).
"""

from __future__ import annotations

from .estimate import GIB, MIB
from .kvlog import FLAG, rank_order
from .model import (
    EngineComparison,
    KvComparison,
    RankComparison,
    RankFigures,
    ServerLog,
)

DEFAULT_TOLERANCE_GIB = 0.01
_EPS = 1e-9              # float noise in the differences of two 2-decimal figures
_MIB_PRINT_TOLERANCE = 0.005   # the patch prints the omitted MiB with 2 decimals


def compare_logs(
    off: ServerLog, on: ServerLog, *,
    tolerance_gib: float = DEFAULT_TOLERANCE_GIB, expect_mib: float | None = None,
) -> KvComparison:
    reasons: list[str] = [*off.conflicts, *on.conflicts]
    notes: list[str] = []

    for log in (off, on):
        if log.unknown_flag:
            reasons.append(
                f"{log.source}: vLLM reports {FLAG} as an unknown environment variable; "
                "the patch is not installed in this image"
            )
    if off.capacity_format and on.capacity_format and off.capacity_format != on.capacity_format:
        notes.append("the two logs print the KV capacity in different formats (different vLLM releases?)")

    off_ranks = {r.rank: r for r in off.ranks}
    on_ranks = {r.rank: r for r in on.ranks}
    rank_names = sorted(set(off_ranks) | set(on_ranks), key=rank_order)
    if not rank_names:
        for log in (off, on):
            reasons.append(f"{log.source}: no 'Available KV cache memory' line on any rank")

    ranks: list[RankComparison] = []
    for name in rank_names:
        a, b = off_ranks.get(name, RankFigures(rank=name)), on_ranks.get(name, RankFigures(rank=name))
        rank_reasons: list[str] = []
        for log, figs in ((off, a), (on, b)):
            if figs.kv_gib is None:
                rank_reasons.append(f"{log.source}: no 'Available KV cache memory' line for rank {name}")
        if b.omitted_mib is None:
            rank_reasons.append(f"{on.source}: no {FLAG} omission line for rank {name} (flag on)")
        if a.omitted_mib is not None:
            rank_reasons.append(
                f"{off.source}: {FLAG} omission line on rank {name} although the flag was off"
            )
        delta = expected = None
        if a.kv_gib is not None and b.kv_gib is not None:
            delta = round(b.kv_gib - a.kv_gib, 6)
        if b.omitted_mib is not None:
            expected = b.omitted_mib * MIB / GIB
            if expect_mib is not None and abs(b.omitted_mib - expect_mib) > _MIB_PRINT_TOLERANCE + _EPS:
                rank_reasons.append(
                    f"rank {name}: the log says {b.omitted_mib:.2f} MiB omitted, "
                    f"the estimate is {expect_mib:.2f} MiB"
                )
        if delta is not None and expected is not None and abs(delta - expected) > tolerance_gib + _EPS:
            rank_reasons.append(
                f"rank {name}: available KV memory changed by {delta:+.2f} GiB "
                f"({a.kv_gib} -> {b.kv_gib}) but {b.omitted_mib:.2f} MiB = {expected:.4f} GiB "
                f"was omitted (tolerance +/-{tolerance_gib} GiB)"
            )
        for kind, x, y in (
            ("estimated CUDA graph memory", a.graph_estimate_gib, b.graph_estimate_gib),
            ("captured CUDA graph memory", a.graph_capture_gib, b.graph_capture_gib),
        ):
            if x is not None and y is not None and abs(x - y) > _EPS:
                notes.append(f"rank {name}: {kind} changed: {x} GiB off, {y} GiB on")
        reasons.extend(rank_reasons)
        ranks.append(RankComparison(
            rank=name, kv_gib_off=a.kv_gib, kv_gib_on=b.kv_gib, delta_gib=delta,
            omitted_mib_off=a.omitted_mib, omitted_mib_on=b.omitted_mib,
            expected_delta_gib=expected,
            graph_estimate_gib_off=a.graph_estimate_gib, graph_estimate_gib_on=b.graph_estimate_gib,
            graph_capture_gib_off=a.graph_capture_gib, graph_capture_gib_on=b.graph_capture_gib,
            ok=not rank_reasons,
        ))

    off_engines = {e.engine: e for e in off.engines if e.tokens is not None}
    on_engines = {e.engine: e for e in on.engines if e.tokens is not None}
    engines: list[EngineComparison] = []
    for name in sorted(set(off_engines) | set(on_engines), key=rank_order) or ["DP0"]:
        t_off = off_engines[name].tokens if name in off_engines else None
        t_on = on_engines[name].tokens if name in on_engines else None
        for log, t in ((off, t_off), (on, t_on)):
            if t is None:
                reasons.append(f"{log.source}: no 'GPU KV cache size: N tokens' line for engine {name}")
        delta_t = None if t_off is None or t_on is None else t_on - t_off
        if delta_t is not None and delta_t < 0:
            reasons.append(f"engine {name}: KV capacity dropped from {t_off:,} to {t_on:,} tokens ({delta_t:+,})")
        engines.append(EngineComparison(engine=name, tokens_off=t_off, tokens_on=t_on, delta_tokens=delta_t))

    complete = all(e.tokens_off is not None and e.tokens_on is not None for e in engines)
    tokens_off = sum(e.tokens_off for e in engines) if complete else None  # type: ignore[misc]
    tokens_on = sum(e.tokens_on for e in engines) if complete else None  # type: ignore[misc]
    delta_tokens = None if tokens_off is None or tokens_on is None else tokens_on - tokens_off
    delta_pct = (
        round(100.0 * delta_tokens / tokens_off, 4) if delta_tokens is not None and tokens_off else None
    )
    kv_off = _smallest(r.kv_gib_off for r in ranks)
    kv_on = _smallest(r.kv_gib_on for r in ranks)
    omitted = _smallest(r.omitted_mib_on for r in ranks)
    expected_tokens = None
    if len(engines) == 1 and tokens_off and kv_off and omitted is not None:
        # tokens scale with the bounding rank's KV memory; the off run gives bytes per token.
        expected_tokens = int(tokens_off * (omitted * MIB / GIB) / kv_off)

    return KvComparison(
        off_log=off.source, on_log=on.source,
        tokens_off=tokens_off, tokens_on=tokens_on, delta_tokens=delta_tokens, delta_pct=delta_pct,
        kv_gib_off=kv_off, kv_gib_on=kv_on,
        omission_ranks_off=tuple(r.rank for r in ranks if r.omitted_mib_off is not None),
        omission_ranks_on=tuple(r.rank for r in ranks if r.omitted_mib_on is not None),
        expected_delta_tokens=expected_tokens, tolerance_gib=tolerance_gib,
        ranks=tuple(ranks), engines=tuple(engines),
        verdict="fail" if reasons else "pass", reasons=tuple(reasons), notes=tuple(notes),
    )


def _smallest(values) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None

