"""The patched decision function, driven from the installed tree (flag, methods, resolver)."""

from __future__ import annotations

import ast
import os

from probe_common import (
    AUX_RESOLVER_FN,
    C_BOUNDS,
    C_DFLASH,
    C_FLAG,
    C_FLAG_OFF,
    C_IMPORTS,
    C_INVALID,
    C_MALFORMED,
    C_OTHER,
    C_PP,
    C_PREFERRED,
    C_SKIP,
    C_V1,
    DECISION_FN,
    ENVS_FILE,
    ENVS_TABLE,
    FLAG,
    FLAG_CHOICES,
    INVALID_FLAGS,
    LAYER_VARIANTS,
    MODEL_FILE,
    NUM_TARGET_LAYERS,
    PATCH_SET,
    SPEC_CONFIG_CLASS,
    SPEC_CONFIG_FILE,
    SPEC_METHOD_LITERAL,
    VALID_FLAGS,
    CaseResult,
    FlagEnv,
    Missing,
    Obj,
    Sources,
    class_def,
    compile_function,
    free_names,
    import_map,
    module_defines,
    plain_imports,
    top_level_function,
)


def literal_strings(tree: ast.Module, name: str, seen: set[str] | None = None) -> list[str]:
    """The strings of a module-level `NAME = Literal[...]`, following nested Literal names."""
    seen = seen if seen is not None else set()
    if name in seen:
        return []
    seen.add(name)
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and node.targets[0].id == name
                and isinstance(node.value, ast.Subscript)):
            items = node.value.slice
            elts = items.elts if isinstance(items, ast.Tuple) else [items]
            found: list[str] = []
            for elt in elts:
                if isinstance(elt, ast.Constant) and isinstance(elt.value, str):
                    found.append(elt.value)
                elif isinstance(elt, ast.Name):
                    found.extend(literal_strings(tree, elt.id, seen))
            return found
    raise Missing(f"{name} = Literal[...] not found in {SPEC_CONFIG_FILE}")


def load_spec_config_class(sources: Sources) -> tuple[type, list[str]]:
    """A stand-in SpeculativeConfig whose methods are the installed class's own, and the
    speculative methods the installed tree declares."""
    tree = sources.module(SPEC_CONFIG_FILE)
    cls = class_def(tree, SPEC_CONFIG_CLASS)
    if cls is None:
        raise Missing(f"{SPEC_CONFIG_CLASS} not found in {SPEC_CONFIG_FILE}")
    namespace: dict[str, object] = {}
    methods: dict[str, object] = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("__") and not any(
            isinstance(d, ast.Name) and d.id in ("property", "staticmethod", "classmethod",
                                                  "model_validator", "field_validator")
            for d in node.decorator_list
        ):
            methods[node.name] = compile_function(node, namespace, SPEC_CONFIG_FILE)
    for needed in ("use_dspark", "use_eagle", "uses_draft_model"):
        if needed not in methods:
            raise Missing(f"{SPEC_CONFIG_CLASS}.{needed} not found in {SPEC_CONFIG_FILE}")
    spec_cls = type("SpeculativeConfigUnderProbe", (Obj,), methods)
    return spec_cls, literal_strings(tree, SPEC_METHOD_LITERAL)


def make_vllm_config(spec_cls, *, method: str | None, v2: bool, pp: int,
                     hf: dict[str, object], rows: int, dtype):
    spec = None
    if method is not None:
        attrs = {"model_type": "deepseek_v4", **hf}
        spec = spec_cls(
            method=method, num_speculative_tokens=3, disable_eagle_block_drop=False,
            num_speculative_tokens_per_batch_size=None,
            draft_model_config=Obj(hf_config=Obj(**attrs), architectures=[], use_mla=False),
        )
    return Obj(
        speculative_config=spec,
        use_v2_model_runner=v2,
        parallel_config=Obj(pipeline_parallel_size=pp),
        scheduler_config=Obj(max_num_batched_tokens=rows),
        model_config=Obj(dtype=dtype),
    )


class Envs:
    """Stands in for the vllm.envs module: its __getattr__ over the real table entry."""

    def __init__(self, getters: dict[str, object]) -> None:
        self._getters = getters

    def __getattr__(self, name: str):
        if name in self._getters:
            return self._getters[name]()
        raise AttributeError(f"module 'vllm.envs' has no attribute {name!r}")


def load_envs(sources: Sources) -> tuple[Envs, str | None]:
    """The real entry for FLAG from envs.py's table, with envs.py's own helpers."""
    tree = sources.module(ENVS_FILE)
    namespace: dict[str, object] = {"os": os}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and not node.name.startswith("__"):
            compile_function(node, namespace, ENVS_FILE)
    table = None
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
        if isinstance(target, ast.Name) and target.id == ENVS_TABLE:
            table = node.value
    if not isinstance(table, ast.Dict):
        raise Missing(f"{ENVS_TABLE} table not found in {ENVS_FILE}")
    for key, value in zip(table.keys, table.values, strict=True):
        if isinstance(key, ast.Constant) and key.value == FLAG:
            expr = ast.fix_missing_locations(ast.Expression(body=value))
            getter = eval(compile(expr, f"<{ENVS_FILE}:{FLAG}>", "eval"), namespace)
            return Envs({FLAG: getter}), None
    return Envs({}), f"{FLAG} is not registered in {ENVS_TABLE} ({ENVS_FILE})"

# --- the decision, from the installed tree --------------------------------------------

class Decision:
    """The patched decision function compiled from the installed model file, with every
    name it uses resolved the way Python would resolve it in the installed tree."""

    def __init__(self, sources: Sources, envs: Envs) -> None:
        self.resolved: list[str] = []
        self.problems: list[str] = []
        self.resolver_from: tuple[str, str] | None = None
        model = sources.module(MODEL_FILE)
        fn = top_level_function(model, DECISION_FN)
        if fn is None:
            raise Missing(f"{DECISION_FN} not found in {MODEL_FILE}: the {PATCH_SET} patch is not applied")
        self.node = fn
        imports = import_map(model, MODEL_FILE)
        plain = plain_imports(model)
        namespace: dict[str, object] = {}
        for name in sorted(free_names(fn)):
            if name in imports:
                module, attr = imports[name]
                where = sources.module_file(module)
                if where is None:
                    self.problems.append(f"`from {module} import {attr}`: {module} is not in the installed tree")
                    continue
                node = module_defines(sources.module(where), attr)
                if node is None and sources.module_file(f"{module}.{attr}") is None:
                    self.problems.append(f"`from {module} import {attr}`: {where} does not define {attr}")
                    continue
                self.resolved.append(f"{name} <- {where}")
                if isinstance(node, ast.FunctionDef):
                    namespace[name] = compile_function(node, {}, where)
                    if attr == AUX_RESOLVER_FN:
                        self.resolver_from = (where, attr)
            elif name in plain:
                dotted = plain[name]
                if dotted != "vllm.envs" or sources.module_file(dotted) is None:
                    self.problems.append(f"`import {dotted}`: not a module the probe can model")
                    continue
                namespace[name] = envs
                self.resolved.append(f"{name} <- {ENVS_FILE}")
            elif isinstance(module_defines(model, name), ast.FunctionDef):
                helper = module_defines(model, name)
                assert isinstance(helper, ast.FunctionDef)
                namespace[name] = compile_function(helper, {"envs": envs}, MODEL_FILE)
                self.resolved.append(f"{name} <- {MODEL_FILE}")
            else:
                self.problems.append(f"{DECISION_FN} uses {name}, which {MODEL_FILE} neither "
                                     "imports nor defines as a function")
        self.fn = compile_function(fn, namespace, MODEL_FILE)

    def __call__(self, cfg, num_layers: int):
        return self.fn(cfg, num_layers)


def valid_layer_ids(ids: object, num_layers: int) -> bool:
    # Capture-after ids: DeepseekV4Model captures after layer idx when idx + 1 is listed,
    # idx in 0..N-1 at PP 1, so exactly 1..N are ever captured; duplicates capture once.
    return (isinstance(ids, tuple) and len(ids) > 0
            and all(type(i) is int and 1 <= i <= num_layers for i in ids)
            and len(set(ids)) == len(ids))


class Row:
    def __init__(self, flag: str, method: str | None, v2: bool, pp: int,
                 bucket: str, label: str, hf: dict[str, object]) -> None:
        self.flag, self.method, self.v2, self.pp = flag, method, v2, pp
        self.bucket, self.label, self.hf = bucket, label, hf

    def describe(self) -> str:
        return (f"flag {self.flag}, {self.method or 'no speculation'}, "
                f"{'V2' if self.v2 else 'V1'}, PP{self.pp}, {self.label}")


def decision_rows(methods: list[str]):
    for flag in VALID_FLAGS:
        for method in [*methods, None]:
            for v2 in (False, True):
                for pp in (1, 2):
                    for bucket, label, hf in LAYER_VARIANTS:
                        yield Row(flag, method, v2, pp, bucket, label, hf)


def promise_of(row: Row) -> str:
    if row.flag != "1":
        return C_FLAG_OFF
    if row.method == "dflash":
        return C_DFLASH
    if row.method != "dspark":
        return C_OTHER
    if not row.v2:
        return C_V1
    if row.pp != 1:
        return C_PP
    return {"valid": C_SKIP, "bounds": C_BOUNDS, "malformed": C_MALFORMED,
            "resolver": C_PREFERRED}[row.bucket]


def decision_cases(torch, decision, spec_cls, methods, resolver) -> list[CaseResult]:
    names = [C_FLAG_OFF, C_SKIP, C_DFLASH, C_OTHER, C_V1, C_PP, C_BOUNDS, C_MALFORMED, C_PREFERRED]
    if decision is None:
        return [CaseResult(n, False, f"{DECISION_FN} could not be loaded (see '{C_IMPORTS}')")
                for n in names]
    wrong: dict[str, list[str]] = {n: [] for n in names}
    total: dict[str, int] = {n: 0 for n in names}
    skips: dict[str, int] = {n: 0 for n in names}
    for row in decision_rows(methods):
        promise = promise_of(row)
        total[promise] += 1
        cfg = make_vllm_config(spec_cls, method=row.method, v2=row.v2, pp=row.pp, hf=row.hf,
                               rows=4096, dtype=torch.bfloat16)
        spec = cfg.speculative_config
        ids = resolver(spec) if spec is not None else None
        want = (row.flag == "1" and row.method == "dspark" and row.v2 and row.pp == 1
                and valid_layer_ids(ids, NUM_TARGET_LAYERS))
        skips[promise] += want
        try:
            with FlagEnv(VALID_FLAGS[row.flag]):
                got = decision(cfg, NUM_TARGET_LAYERS)
        except Exception as exc:
            wrong[promise].append(f"{row.describe()}: raised {type(exc).__name__}: {exc}")
            continue
        if got is not want:
            wrong[promise].append(f"{row.describe()} (runner resolves {ids!r}): "
                                  f"returned {got!r}, expected {want!r}")
    cases = []
    for name in names:
        if wrong[name]:
            cases.append(CaseResult(name, False, f"{len(wrong[name])}/{total[name]} combinations "
                                   "wrong: " + "; ".join(wrong[name][:4])))
        else:
            cases.append(CaseResult(name, True, f"{total[name]}/{total[name]} combinations as "
                                   f"expected ({skips[name]} skip the buffer)"))
    return cases


def invalid_flag_case(torch, decision, spec_cls, methods) -> CaseResult:
    name = C_INVALID
    if decision is None:
        return CaseResult(name, False, f"{DECISION_FN} could not be loaded")
    wrong: list[str] = []
    total = 0
    for value in INVALID_FLAGS:
        for method in [*methods, None]:
            for v2 in (False, True):
                total += 1
                cfg = make_vllm_config(spec_cls, method=method, v2=v2, pp=1,
                                       hf=dict(LAYER_VARIANTS[0][2]), rows=4096,
                                       dtype=torch.bfloat16)
                label = f"{FLAG}={value!r} {method}/{'V2' if v2 else 'V1'}"
                try:
                    with FlagEnv(value):
                        got = decision(cfg, NUM_TARGET_LAYERS)
                except ValueError as exc:
                    text = str(exc)
                    if FLAG not in text or not all(repr(c) in text for c in FLAG_CHOICES):
                        wrong.append(f"{label}: error does not name {FLAG} and {FLAG_CHOICES}: {text}")
                    continue
                except Exception as exc:
                    wrong.append(f"{label}: raised {type(exc).__name__} instead of ValueError: {exc}")
                    continue
                wrong.append(f"{label}: returned {got!r} instead of refusing the value")
    if wrong:
        return CaseResult(name, False, f"{len(wrong)}/{total} combinations wrong: " + "; ".join(wrong[:4]))
    return CaseResult(name, True, f"{total}/{total} invalid-value combinations refused with an "
                     f"error naming {FLAG} and the allowed values {list(FLAG_CHOICES)}")

def envs_registration_case(envs: Envs, problem: str | None) -> CaseResult:
    name = C_FLAG
    if problem:
        return CaseResult(name, False, f"{problem}: vLLM would warn (or fail with "
                         "--fail-on-environ-validation) on an unknown variable")
    seen: dict[str, object] = {}
    for label, value in (("unset", None), ("0", "0"), ("1", "1")):
        with FlagEnv(value):
            seen[label] = getattr(envs, FLAG)
    want = {"unset": False, "0": False, "1": True}
    if seen != want:
        return CaseResult(name, False, f"{FLAG} parses as {seen}, expected {want}")
    return CaseResult(name, True, f"{FLAG} registered in {ENVS_FILE}; unset/0/1 -> {seen}")


# --- cases: the allocation site in DeepseekV4Model.__init__ ---------------------------
