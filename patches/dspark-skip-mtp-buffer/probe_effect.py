"""The patch's effect, whoever makes the decision: the allocation site in DeepseekV4Model.__init__
run as the installed tree wrote it, with every function it calls loaded from the tree.

On a patched release the decision is the patch's `dspark_skips_mtp_hidden_buffer` under the flag
(set to 1 here); on a release that ships the change in its own form (0.34.0:
`needs_mtp_hidden_buffer` in vllm/models/deepseek_v4/common/spec_decode.py) it is upstream's, and
the flag changes nothing. The case holds the promise itself: DSpark on the seed's path (Model
Runner V2, PP 1, valid auxiliary layers) allocates nothing, and the methods that read the buffer
(MTP, EAGLE3, DFlash) still get it. It also says, without judging, where else DSpark goes without
the buffer: a release whose scope is wider than the reviewed patch's shows it there.
"""

from __future__ import annotations

import ast

from probe_allocation import _allocation_slice, run_allocation
from probe_common import (
    BUFFER_ATTR,
    C_EFFECT,
    DECISION_FN,
    MODEL_CLASS,
    MODEL_FILE,
    CaseResult,
    Missing,
    Sources,
    compile_function,
    import_map,
    top_level_function,
)

# Where the decision lives, as "path:function" entries (the probe's JSON `where`): the allocation
# site, upstream's decision function and every DeepSeek V4 model file that calls it. `port`
# writes these into a candidate superseded record.
EFFECT_WHERE: list[str] = []

# The methods that read the buffer: each must still allocate it (when the tree declares it).
KEEPERS = ("mtp", "eagle3", "dflash")
# The seed's "keeps the buffer" cases for DSpark itself, as (label, flag, V2, PP, aux layers):
# reported, not judged (a release may choose otherwise on purpose; a reviewer reads them).
SCOPE = (
    ("flag unset", None, True, 1, True),
    ("Model Runner V1", "1", False, 1, True),
    ("pipeline parallel size 2", "1", True, 2, True),
    ("no auxiliary layer ids", "1", True, 1, False),
)


def called_functions(sources: Sources, stmts: list[ast.stmt], known: set[str]) -> dict[str, tuple[object, str]]:
    """The top-level functions the slice calls by a name the model file imports from another
    installed module (upstream's decision, e.g. `needs_mtp_hidden_buffer`), loaded from that
    module's own source; names already `known` are left as they are."""
    imported = import_map(sources.module(MODEL_FILE), MODEL_FILE)
    loaded: dict[str, tuple[object, str]] = {}
    for stmt in stmts:
        for node in ast.walk(stmt):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)):
                continue
            name = node.func.id
            if name in known or name in loaded or name not in imported:
                continue
            module, original = imported[name]
            rel = sources.module_file(module)
            if rel is None or not module.startswith("vllm."):
                continue
            fn = top_level_function(sources.module(rel), original)
            if fn is not None:
                loaded[name] = (compile_function(fn, {}, rel), rel)
    return loaded


def _callers(sources: Sources, names: list[str]) -> list[str]:
    """The allocation site's file, then every other DeepSeek V4 model file importing one of `names`."""
    found = [MODEL_FILE]
    for path in sorted((sources.site / "vllm" / "models").glob("deepseek_v4*/*/model.py")):
        rel = path.relative_to(sources.site).as_posix()
        if rel != MODEL_FILE and names and any(
                isinstance(node, ast.ImportFrom) and any(a.name in names for a in node.names)
                for node in sources.module(rel).body):
            found.append(rel)
    return found


def effect_case(torch, sources: Sources, decision, envs, spec_cls, methods: list[str]) -> CaseResult:
    name = C_EFFECT
    try:
        stmts = _allocation_slice(sources)
        module = ast.fix_missing_locations(ast.Module(body=stmts, type_ignores=[]))
        code = compile(module, f"<{MODEL_FILE}:{MODEL_CLASS}.__init__>", "exec")
        called = called_functions(sources, stmts, {DECISION_FN, "get_pp_group", "torch", "envs", "logger"})
    except Missing as exc:
        return CaseResult(name, False, str(exc))
    extra = {fn_name: fn for fn_name, (fn, _rel) in called.items()}
    EFFECT_WHERE[:] = [f"{rel}:{fn_name}" for fn_name, (_fn, rel) in sorted(called.items())]
    EFFECT_WHERE.extend(f"{rel}:{MODEL_CLASS}.__init__" for rel in _callers(sources, sorted(called)))

    def allocated(*, flag, method, v2=True, pp=1, aux=True) -> bool:
        buf, _records = run_allocation(torch, code, decision, envs, spec_cls, flag=flag, method=method, pp=pp,
                                       rows=8, hc_dim=16, v2=v2, aux=aux, extra=extra)
        if buf is None:
            return False
        if isinstance(buf, torch.Tensor) and tuple(buf.shape) == (8, 16):
            return True
        raise Missing(f"{BUFFER_ATTR} is neither None nor an (8, 16) tensor: {buf!r}")

    problems: list[str] = []
    try:
        if allocated(flag="1", method="dspark"):
            problems.append("DSpark on Model Runner V2, PP 1, valid aux layers: the buffer is allocated")
        keepers = [m for m in KEEPERS if m in methods] or list(KEEPERS)
        lost = [m for m in keepers if not allocated(flag="1", method=m)]
        if lost:
            problems.append(f"{', '.join(lost)}: the buffer is no longer allocated (they read it)")
        wider = [label for label, flag, v2, pp, aux in SCOPE
                 if not allocated(flag=flag, method="dspark", v2=v2, pp=pp, aux=aux)]
    except Missing as exc:
        return CaseResult(name, False, str(exc))
    except Exception as exc:
        return CaseResult(name, False, f"allocation site raised {type(exc).__name__}: {exc}")
    by = ", ".join(sorted(extra)) or (DECISION_FN if decision is not None else "the allocation site itself")
    if problems:
        return CaseResult(name, False, "; ".join(problems) + f" (decided by {by})")
    scope = (f"; beyond the reviewed scope DSpark also goes without it with: {', '.join(wider)}" if wider
             else "; DSpark keeps it outside the reviewed scope (flag unset, V1, PP 2, no aux layers)")
    return CaseResult(name, True, f"decided by {by}: DSpark (V2, PP 1, valid aux layers) allocates nothing; "
                      f"{', '.join(keepers)} keep the buffer{scope}")
