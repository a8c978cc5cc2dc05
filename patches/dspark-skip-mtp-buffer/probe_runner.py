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
    NOT_PRESENT,
    V2_RUNNER_FILE,
    CaseResult,
)


def runner_case(refs: list[Ref], helper_present: bool) -> CaseResult:
    """The V2 runner's call sites that reach the buffer. Where the release has the drafter
    helper (0.32.0, 0.33.0) the runner must go through it; where it has none (0.31.0) the
    runner reads the accessor itself, and each such read must be None-safe: an unguarded one
    is named by file:line and function."""
    site = [r for r in refs if r.rel == V2_RUNNER_FILE]
    calls = [r for r in site if r.kind == "helper call"]
    if not helper_present:
        direct = [r for r in site if r.symbol in (ACCESSOR, BUFFER_ATTR)]
        unsafe = [r for r in site if not r.none_safe]
        what = f"{DRAFTER_FN} is {NOT_PRESENT}: the V2 runner reads {ACCESSOR} itself"
        if unsafe:
            return CaseResult(C_RUNNER, False, f"{what}, unguarded at " + "; ".join(
                f"{r.rel}:{r.line} {r.function} ({r.kind}): {r.why}" for r in unsafe))
        if not direct:
            return CaseResult(C_RUNNER, False, f"{what}? {V2_RUNNER_FILE} never reaches it: the census "
                              "cannot vouch for how the drafter gets hidden states")
        return CaseResult(C_RUNNER, True, f"{what}; every read is None-safe: " + ", ".join(
            f"{r.function} line {r.line} ({r.why})" for r in direct))
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
