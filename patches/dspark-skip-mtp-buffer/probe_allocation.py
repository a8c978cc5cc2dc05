"""The allocation site in DeepseekV4Model.__init__: skip with one INFO line, or allocate."""

from __future__ import annotations

import ast

from probe_common import (
    BUFFER_ATTR,
    C_ALLOC,
    DECISION_FN,
    FLAG,
    LAYER_VARIANTS,
    MODEL_CLASS,
    MODEL_FILE,
    NUM_TARGET_LAYERS,
    PATCH_SET,
    REAL_HC_DIM,
    REAL_MIB,
    REAL_ROWS,
    CaseResult,
    FakeLogger,
    FlagEnv,
    Missing,
    Obj,
    Sources,
    class_def,
    method_def,
)
from probe_decision import (
    Envs,
    make_vllm_config,
)


def _allocation_slice(sources: Sources) -> list[ast.stmt]:
    cls = class_def(sources.module(MODEL_FILE), MODEL_CLASS)
    init = cls and method_def(cls, "__init__")
    if init is None:
        raise Missing(f"{MODEL_CLASS}.__init__ not found in {MODEL_FILE}")
    body = init.body
    last = None
    for i, stmt in enumerate(body):
        for node in ast.walk(stmt):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == BUFFER_ATTR
                and isinstance(node.ctx, ast.Store)
                and isinstance(stmt, ast.If)
            ):
                last = i
    if last is None:
        raise Missing(f"no `if` assigning self.{BUFFER_ATTR} in {MODEL_CLASS}.__init__")
    first = None
    for i in range(last, -1, -1):
        stmt = body[i]
        if isinstance(stmt, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "spec_config" for t in stmt.targets
        ):
            first = i
            break
    if first is None:
        raise Missing(f"spec_config assignment before the {BUFFER_ATTR} site not found")
    return body[first : last + 1]


class PpGroup:
    def __init__(self, pp: int) -> None:
        self.is_last_rank = True  # the rank that would own the buffer
        self.world_size = pp


def run_allocation(torch, code, decision, envs, spec_cls, *, flag, method, pp, rows, hc_dim,
                   v2=True, aux=True, extra=None):
    """Run the allocation slice once; `extra`: functions it calls that the tree defines elsewhere
    (upstream's decision), loaded by probe_effect.called_functions."""
    logger = FakeLogger()
    self_obj = Obj(hc_dim=hc_dim)
    cfg = make_vllm_config(
        spec_cls, method=method, v2=v2, pp=pp, hf=dict(LAYER_VARIANTS[0][2]) if aux else {}, rows=rows,
        dtype=torch.bfloat16,
    )
    namespace: dict[str, object] = {
        "torch": torch,
        "envs": envs,
        "logger": logger,
        "get_pp_group": lambda: PpGroup(pp),
        "self": self_obj,
        "vllm_config": cfg,
        "config": Obj(num_hidden_layers=NUM_TARGET_LAYERS, hidden_size=hc_dim // 4),
    }
    if decision is not None:
        namespace[DECISION_FN] = decision
    namespace.update(extra or {})
    with FlagEnv(flag):
        exec(code, namespace)
    return getattr(self_obj, BUFFER_ATTR, "<unset>"), logger.records


def allocation_case(torch, sources: Sources, decision, envs: Envs, spec_cls) -> CaseResult:
    name = C_ALLOC
    try:
        stmts = _allocation_slice(sources)
    except Missing as exc:
        return CaseResult(name, False, str(exc))
    module = ast.fix_missing_locations(ast.Module(body=stmts, type_ignores=[]))
    code = compile(module, f"<{MODEL_FILE}:{MODEL_CLASS}.__init__>", "exec")
    problems: list[str] = []
    try:
        buf, records = run_allocation(
            torch, code, decision, envs, spec_cls, flag="1", method="dspark", pp=1,
            rows=REAL_ROWS, hc_dim=REAL_HC_DIM,
        )
        infos = [m for level, m in records if level == "INFO"]
        if buf is not None:
            problems.append(f"{FLAG}=1, V2 DSpark, PP1, valid aux: buffer still allocated "
                            f"(the {PATCH_SET} patch is not applied?)")
        elif len(infos) != 1 or FLAG not in infos[0] or f"{REAL_MIB} MiB" not in infos[0]:
            problems.append(f"skip must log one INFO line naming {FLAG} and "
                            f"{REAL_MIB} MiB; logged {records}")
        skip_line = infos[0] if infos else ""
        for flag, method, pp in ((None, "dspark", 1), ("0", "dspark", 1),
                                 ("1", "mtp", 1), ("1", "dspark", 2)):
            buf, records = run_allocation(
                torch, code, decision, envs, spec_cls, flag=flag, method=method, pp=pp,
                rows=8, hc_dim=16,
            )
            label = f"{FLAG}={flag} {method} PP{pp}"
            if not (isinstance(buf, torch.Tensor) and tuple(buf.shape) == (8, 16)
                    and buf.dtype == torch.bfloat16):
                problems.append(f"{label}: expected an (8, 16) bfloat16 buffer, got {buf!r}")
            if records:
                problems.append(f"{label}: unexpected log lines {records}")
    except Exception as exc:
        problems.append(f"allocation site raised {type(exc).__name__}: {exc}")
    if problems:
        return CaseResult(name, False, "; ".join(problems))
    return CaseResult(name, True, f"skips with one INFO line ({skip_line!r}); allocates "
                     "for flag unset/0, ordinary MTP and PP2")

# --- cases: the consumer --------------------------------------------------------------
