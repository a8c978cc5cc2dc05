"""Cases about Model Runner V2's call sites that hand target hidden states to the drafter."""

from __future__ import annotations

from probe_census import (
    Ref,
)
from probe_common import (
    ACCESSOR,
    BUFFER_ATTR,
    C_RUNNER,
    DRAFTER_FN,
    V2_RUNNER_FILE,
    CaseResult,
)


def runner_case(refs: list[Ref]) -> CaseResult:
    site = [r for r in refs if r.rel == V2_RUNNER_FILE]
    calls = [r for r in site if r.kind == "helper call"]
    other = [r for r in site if r.symbol != DRAFTER_FN or not r.none_safe]
    if other:
        return CaseResult(C_RUNNER, False, "; ".join(
            f"{r.rel}:{r.line} {r.function} reads {r.symbol} ({r.kind}): {r.why}" for r in other))
    if not calls:
        return CaseResult(C_RUNNER, False, f"{V2_RUNNER_FILE} never calls {DRAFTER_FN}: "
                         "the census cannot vouch for how the drafter gets hidden states")
    return CaseResult(C_RUNNER, True, f"{len(calls)} call sites ("
                     + ", ".join(f"{r.function} line {r.line}" for r in calls)
                     + f"), no direct read of {BUFFER_ATTR} or {ACCESSOR}")

# --- running ----------------------------------------------------------------------------
