"""Consumer CPU probe for the dspark-skip-mtp-buffer patch set (standalone: stdlib + torch).

Run by the target's own interpreter, never importing vLLM (images may lack its GPU
libraries):

    PYTHON -B probe.py --site SITE_PACKAGES_DIR [--json]
    PYTHON -B -c "<this source>" --site SITE_PACKAGES_DIR

It carries the claim "nothing on the DSpark Model Runner V2 path reads _mtp_hidden_buffer
when the patch leaves it unallocated" from the *installed* sources alone (no hashes):

- census: every reference to the buffer, its accessor and the drafter helper in the whole
  installed vllm tree, found by AST, each with a verdict: reached on the DSpark V2 path or
  not, None-safe (guarded, passed on by an accessor, or through the helper's fallback) or
  not. An unguarded reader on the path fails the probe, named by file:line;
- the decision: the patched function driven with the tree's own layer-id resolver and
  SpeculativeConfig methods, over every speculative method the tree declares, V1/V2,
  PP 1/2, the flag unset/0/1/invalid and layer ids at and beyond their bounds; its own
  imports must resolve in the tree;
- the allocation site in DeepseekV4Model.__init__ (skip + one INFO line, or allocate);
- every consumer of target hidden states on DSparkSpeculator (resolved through its bases
  in the installed files): _store_hidden_states in its branches, graph-replay preparation
  and the FULL graph's context step, run with a poison residual that fails on any read;
  every other method receiving the residual may only hand it to those;
- get_drafter_hidden_states falling back to the regular hidden states without the buffer.

Each case is named after the promise it guards. Stdout: one JSON object
{"schema", "ok", "cases": [{"name", "ok", "detail"}], "census": [...]}.
Exit 0 all cases pass, 1 any case failed, 2 bad usage, 3 torch not importable. Writes
nothing to disk and does not rely on __file__.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
from pathlib import Path

SCHEMA = "dspark-patch/probe/v1"
PATCH_SET = "dspark-skip-mtp-buffer"
FLAG = "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER"
FLAG_CHOICES = ("0", "1")

MODEL_FILE = "vllm/models/deepseek_v4/nvidia/model.py"
MODEL_CLASS = "DeepseekV4Model"
DECISION_FN = "dspark_skips_mtp_hidden_buffer"
BUFFER_ATTR = "_mtp_hidden_buffer"
ACCESSOR = "get_mtp_target_hidden_states"
ENVS_FILE = "vllm/envs.py"
ENVS_TABLE = "environment_variables"
AUX_RESOLVER_FN = "get_eagle3_aux_layers_from_config"
SPEC_CONFIG_FILE = "vllm/config/speculative.py"
SPEC_CONFIG_CLASS = "SpeculativeConfig"
SPEC_METHOD_LITERAL = "SpeculativeMethod"
CONSUMER_FILE = "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py"
CONSUMER_CLASS = "DSparkSpeculator"
CONSUMER_METHOD = "_store_hidden_states"
REPLAY_METHOD = "_prepare_graph_replay"
GRAPH_FORWARD_METHOD = "_prepare_graph_forward"
RESIDUAL_PARAM = "last_hidden_states"
# The methods run with the poison residual; any other method receiving it may only pass it on.
CHECKED_CONSUMERS = (CONSUMER_METHOD, REPLAY_METHOD)
DRAFTER_FILE = "vllm/v1/worker/gpu/spec_decode/utils.py"
DRAFTER_FN = "get_drafter_hidden_states"
V2_PACKAGE = "vllm/v1/worker/gpu/"
V2_RUNNER_FILE = "vllm/v1/worker/gpu/model_runner.py"
SPEC_DECODE_PACKAGE = "vllm/v1/worker/gpu/spec_decode/"
MODEL_DIRS = ("vllm/models/", "vllm/model_executor/models/")
# Wrappers around the NVIDIA DeepSeek V4 language model (the VL model delegates to it).
MODEL_WRAPPERS = ("vllm/models/deepseek_v4/common/",)
CENSUS_SYMBOLS = (BUFFER_ATTR, ACCESSOR, DRAFTER_FN)

# Synthetic DeepSeek V4 geometry for the truth table (V4 Flash has 43 target layers).
NUM_TARGET_LAYERS = 43
# The geometry the seed reports: 4096 tokens x 4096 hidden x hc_mult 4, bf16 -> 128 MiB.
REAL_ROWS, REAL_HC_DIM, REAL_MIB = 4096, 4 * 4096, "128.00"

N = NUM_TARGET_LAYERS
# Draft hf_config variants: (bucket, label, attributes). The runner resolves them with
# get_eagle3_aux_layers_from_config; the expected answer comes from that same resolver.
LAYER_VARIANTS: list[tuple[str, str, dict[str, object]]] = [
    ("valid", "dspark ids 0,20,40", {"dspark_target_layer_ids": [0, 20, 40]}),
    ("bounds", "lower bound 1 (dspark id 0)", {"dspark_target_layer_ids": [0]}),
    ("bounds", f"upper bound N={N} (dspark id {N - 1})", {"dspark_target_layer_ids": [N - 1]}),
    ("bounds", "lower bound 1 (eagle ids)", {"eagle_aux_hidden_state_layer_ids": [1]}),
    ("bounds", f"upper bound N={N} (eagle ids)", {"eagle_aux_hidden_state_layer_ids": [N]}),
    ("bounds", "0 (dspark id -1)", {"dspark_target_layer_ids": [-1, 20]}),
    ("bounds", f"N+1={N + 1} (dspark id {N})", {"dspark_target_layer_ids": [0, N]}),
    ("bounds", "0 (eagle ids)", {"eagle_aux_hidden_state_layer_ids": [0, 21]}),
    ("bounds", f"N+1={N + 1} (eagle ids)", {"eagle_aux_hidden_state_layer_ids": [21, N + 1]}),
    ("bounds", "negative", {"dspark_target_layer_ids": [-5, 20]}),
    ("malformed", "non-int floats", {"dspark_target_layer_ids": [1.0, 21.0]}),
    ("malformed", "non-int strings", {"eagle_aux_hidden_state_layer_ids": ["1", "21"]}),
    ("malformed", "bools", {"eagle_aux_hidden_state_layer_ids": [True]}),
    ("malformed", "duplicates", {"dspark_target_layer_ids": [1, 1, 41]}),
    ("malformed", "empty", {"dspark_target_layer_ids": []}),
    ("malformed", "missing", {}),
    ("resolver", "eagle ids preferred over invalid dspark ids",
     {"eagle_aux_hidden_state_layer_ids": [1, 21, 41], "dspark_target_layer_ids": [N + 5]}),
    ("resolver", "invalid eagle ids preferred over valid dspark ids",
     {"eagle_aux_hidden_state_layer_ids": [0, 21], "dspark_target_layer_ids": [0, 20]}),
    ("resolver", "dflash_config target_layer_ids",
     {"dflash_config": {"target_layer_ids": [0, 20, 40]}}),
    ("resolver", "dense target_layer_ids", {"target_layer_ids": [0, 20, 40]}),
    ("resolver", f"deepseek_v41 ids as-is ({N})",
     {"model_type": "deepseek_v41", "dspark_target_layer_ids": [1, N]}),
    ("resolver", "deepseek_v41 ids as-is (0)",
     {"model_type": "deepseek_v41", "dspark_target_layer_ids": [0, 20]}),
]
VALID_FLAGS = {"unset": None, "0": "0", "1": "1"}
INVALID_FLAGS = ("2", "true", "", " 1")

# Case names: each says the promise it guards.
C_FLAG = f"flag: {FLAG} is registered and parses unset/0/1 as off/off/on"
C_METHODS = "decision: driven over every speculative method the installed tree declares"
C_IMPORTS = "decision: its imports resolve in the installed tree"
C_RESOLVER = "decision: uses the runner's own layer-id resolver"
C_FLAG_OFF = "decision: flag unset or 0 keeps the buffer"
C_SKIP = "decision: flag 1 skips for V2 DSpark, PP 1, valid layer ids"
C_DFLASH = "decision: DFlash keeps the buffer"
C_OTHER = "decision: every method other than dspark keeps the buffer"
C_V1 = "decision: Model Runner V1 keeps the buffer"
C_PP = "decision: pipeline parallel size 2 keeps the buffer"
C_BOUNDS = "decision: layer ids 1..N skip, 0, N+1 and negative keep the buffer"
C_MALFORMED = "decision: non-int, duplicate, empty or missing layer ids keep the buffer"
C_PREFERRED = "decision: layer ids are the ones the runner resolves (preferred key, DFlash config, V4.1)"
C_INVALID = "decision: an invalid flag value is a startup error naming the variable"
C_ALLOC = "allocation: skips with one INFO line, allocates for flag off, MTP and PP 2"
C_RESOLUTION = f"consumer: {CONSUMER_METHOD} resolves through {CONSUMER_CLASS}'s bases"
C_BRANCH = {
    "ordinary": "consumer: an eager step combines the aux states, never reads the residual",
    "partial-graph-staging":
        "consumer: partial FULL-graph staging stages and combines aux states, never reads the residual",
    "all-staged": "consumer: an all-staged step only stages aux states, never reads the residual",
}
C_NEGATIVE = "consumer: without aux states it reads the residual (the poison is live)"
C_REPLAY = f"graph replay: {REPLAY_METHOD} never reads the residual"
C_CAPTURE = f"graph capture: {GRAPH_FORWARD_METHOD} combines the staged aux states"
C_PASSES = f"speculator: every DSpark method receiving {RESIDUAL_PARAM} only hands it to the checked consumers"
C_DRAFTER = f"drafter: {DRAFTER_FN} falls back to the regular hidden states without the buffer"
C_FORWARD = f"forward: copies into {BUFFER_ATTR} only when it is allocated"
C_RUNNER = f"runner: the V2 runner feeds the drafter only through {DRAFTER_FN}"
C_CENSUS = f"census: no unguarded reader of {BUFFER_ATTR} on the DSpark V2 path"
C_NO_VLLM = "probe: never imports vllm"

class CaseResult:
    def __init__(self, name: str, ok: bool, detail: str) -> None:
        self.name, self.ok, self.detail = name, ok, detail

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


class Missing(Exception):
    """A source file, class or function the probe needs is not in the installed tree."""


# --- reading installed sources --------------------------------------------------------
class Sources:
    """Parsed installed modules under one site-packages folder (read only, cached in memory)."""

    def __init__(self, site: Path) -> None:
        self.site = site
        self._trees: dict[str, ast.Module] = {}

    def module(self, rel: str) -> ast.Module:
        if rel not in self._trees:
            path = self.site / rel
            if not path.is_file():
                raise Missing(f"{rel} is not in {self.site}")
            self._trees[rel] = ast.parse(path.read_bytes(), filename=rel)
        return self._trees[rel]

    def module_file(self, dotted: str) -> str | None:
        base = dotted.replace(".", "/")
        for rel in (f"{base}.py", f"{base}/__init__.py"):
            if (self.site / rel).is_file():
                return rel
        return None


def top_level_function(tree: ast.Module, name: str) -> ast.FunctionDef | None:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def class_def(tree: ast.Module, name: str) -> ast.ClassDef | None:
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    return None


def method_def(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    return None


def _strip(fn: ast.FunctionDef) -> ast.FunctionDef:
    # Annotations and decorators name vLLM types that are not defined here; the bodies
    # are what the probe runs.
    fn = ast.fix_missing_locations(ast.parse(ast.unparse(fn)).body[0])  # a private copy
    assert isinstance(fn, ast.FunctionDef)
    fn.decorator_list = []
    fn.returns = None
    args = fn.args
    for arg in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]:
        if arg is not None:
            arg.annotation = None
    return fn


def compile_function(fn: ast.FunctionDef, namespace: dict[str, object], rel: str):
    module = ast.Module(body=[_strip(fn)], type_ignores=[])
    exec(compile(ast.fix_missing_locations(module), f"<{rel}:{fn.name}>", "exec"), namespace)
    return namespace[fn.name]


def _import_map(tree: ast.Module, rel: str) -> dict[str, tuple[str, str]]:
    """Local name -> (dotted module, imported name) for the module's `from X import Y`."""
    package = rel.rsplit("/", 1)[0].replace("/", ".") if "/" in rel else ""
    if rel.endswith("/__init__.py"):
        package = rel[: -len("/__init__.py")].replace("/", ".")
    found: dict[str, tuple[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                module = f"{base}.{node.module}" if node.module else base
            else:
                module = node.module or ""
            for alias in node.names:
                found[alias.asname or alias.name] = (module, alias.name)
    return found


# --- synthetic vLLM objects -----------------------------------------------------------
class Obj:
    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)


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

class FakeLogger:
    def __init__(self) -> None:
        self.records: list[tuple[str, str]] = []

    def _log(self, level: str, msg: str, *args: object, **_: object) -> None:
        self.records.append((level, msg % args if args else msg))

    def info(self, msg: str, *args: object, **kw: object) -> None:
        self._log("INFO", msg, *args, **kw)

    def warning(self, msg: str, *args: object, **kw: object) -> None:
        self._log("WARNING", msg, *args, **kw)

    def debug(self, msg: str, *args: object, **kw: object) -> None:
        self._log("DEBUG", msg, *args, **kw)

    info_once, warning_once, debug_once = info, warning, debug


class FlagEnv:
    """Sets or unsets the flag in this process's environment for one evaluation."""

    def __init__(self, value: str | None) -> None:
        self.value = value

    def __enter__(self) -> None:
        self.saved = os.environ.pop(FLAG, None)
        if self.value is not None:
            os.environ[FLAG] = self.value

    def __exit__(self, *exc: object) -> None:
        os.environ.pop(FLAG, None)
        if self.saved is not None:
            os.environ[FLAG] = self.saved


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
def _bound_names(fn: ast.FunctionDef) -> set[str]:
    args = fn.args
    names = {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs,
                             args.vararg, args.kwarg] if a is not None}
    for node in ast.walk(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def free_names(fn: ast.FunctionDef) -> set[str]:
    import builtins

    body = _strip(fn)
    loaded = {n.id for n in ast.walk(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - _bound_names(body) - set(dir(builtins))


def module_defines(tree: ast.Module, name: str) -> ast.stmt | None:
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
        targets = node.targets if isinstance(node, ast.Assign) else (
            [node.target] if isinstance(node, ast.AnnAssign) else [])
        if any(isinstance(t, ast.Name) and t.id == name for t in targets):
            return node
        if isinstance(node, (ast.Import, ast.ImportFrom)) and any(
            (a.asname or a.name.split(".")[0]) == name for a in node.names
        ):
            return node
    return None


def _plain_imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted module for `import a.b as c` (and `import a`)."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
    return found


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
        imports = _import_map(model, MODEL_FILE)
        plain = _plain_imports(model)
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


def runner_resolver(sources: Sources) -> tuple[object, str]:
    """The layer-id resolver DSpark's speculator classes import (DFlashSpeculator.__init__
    sizes the aux staging with it; the V2 runner's set_eagle3_aux_hidden_state_layers
    calls the same function)."""
    for rel, _cls in dspark_mro(sources):
        imports = _import_map(sources.module(rel), rel)
        if AUX_RESOLVER_FN in imports:
            module, attr = imports[AUX_RESOLVER_FN]
            where = sources.module_file(module)
            node = top_level_function(sources.module(where), attr) if where else None
            if node is not None:
                return compile_function(node, {}, where), where
    raise Missing(f"no class in {CONSUMER_CLASS}'s bases imports {AUX_RESOLVER_FN}")


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


def run_allocation(torch, code, decision, envs, spec_cls, *, flag, method, pp, rows, hc_dim):
    logger = FakeLogger()
    self_obj = Obj(hc_dim=hc_dim)
    cfg = make_vllm_config(
        spec_cls, method=method, v2=True, pp=pp, hf=dict(LAYER_VARIANTS[0][2]), rows=rows,
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
class PoisonRead(Exception):
    pass


def make_poison(torch, rows: int, cols: int, reads: list[str]):
    class PoisonResidual(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            what = getattr(func, "__name__", repr(func))
            reads.append(what)
            raise PoisonRead(f"the MTP residual (last_hidden_states) was read via {what}")

    return torch.zeros(rows, cols).as_subclass(PoisonResidual)


class StubProjection:
    """Stands in for the draft's combine_hidden_states (main_proj): a fixed matmul."""

    def __init__(self, weight) -> None:
        self.weight = weight
        self.calls = 0

    def combine_hidden_states(self, x):
        self.calls += 1
        return x @ self.weight


SENTINEL = -7.0


class ConsumerBench:
    """Synthetic aux tensors and draft buffers around one call of the real consumer."""

    def __init__(self, torch, consumer, *, staging: bool) -> None:
        gen = torch.Generator().manual_seed(1234)
        self.torch, self.consumer = torch, consumer
        self.max_tokens, self.aux_width, self.num_aux, self.draft_hidden = 16, 5, 3, 6
        self.aux = [
            torch.randn(self.max_tokens, self.aux_width, generator=gen)
            for _ in range(self.num_aux)
        ]
        self.weight = torch.randn(self.num_aux * self.aux_width, self.draft_hidden, generator=gen)
        self.projection = StubProjection(self.weight)
        self.owner = Obj(
            model=self.projection,
            hidden_states=torch.full((self.max_tokens, self.draft_hidden), SENTINEL),
            _aux_staging=(
                torch.full((self.max_tokens, self.num_aux * self.aux_width), SENTINEL)
                if staging else None
            ),
        )

    def reference_rows(self, start: int, stop: int):
        # Independent of the consumer: row by row, element by element concatenation.
        torch = self.torch
        rows = []
        for r in range(start, stop):
            rows.append(torch.stack([h[r, c] for h in self.aux for c in range(self.aux_width)]))
        return torch.stack(rows) if rows else torch.empty(0, self.num_aux * self.aux_width)

    def call(self, num_tokens: int, residual, aux, num_graph_tokens: int) -> None:
        self.consumer(self.owner, num_tokens, residual, aux, num_graph_tokens)


def _untouched(torch, t) -> bool:
    return bool(torch.all(t == SENTINEL)) if t.numel() else True


def consumer_branch_case(torch, consumer, branch: str) -> CaseResult:
    name = C_BRANCH[branch]
    if consumer is None:
        return CaseResult(name, False, f"{CONSUMER_CLASS}.{CONSUMER_METHOD} not resolved")
    n = 11
    graph_tokens = {"ordinary": 0, "partial-graph-staging": 4, "all-staged": 14}[branch]
    bench = ConsumerBench(torch, consumer, staging=branch != "ordinary")
    reads: list[str] = []
    poison = make_poison(torch, bench.max_tokens, bench.draft_hidden, reads)
    try:
        bench.call(n, poison, bench.aux, graph_tokens)
    except PoisonRead as exc:
        return CaseResult(name, False, f"{exc}: DSpark must not read the MTP residual")
    except Exception as exc:
        return CaseResult(name, False, f"consumer raised {type(exc).__name__}: {exc}")
    if reads:
        return CaseResult(name, False, f"the MTP residual was read ({reads}) and the error swallowed")
    owner, problems = bench.owner, []
    staged = min(n, graph_tokens) if owner._aux_staging is not None else 0
    if staged:
        want = bench.reference_rows(0, staged)
        if not torch.equal(owner._aux_staging[:staged], want):
            problems.append(f"staged rows 0..{staged} differ from the concatenated aux states")
        if not _untouched(torch, owner._aux_staging[staged:]):
            problems.append(f"staging rows past {staged} were written")
        if not _untouched(torch, owner.hidden_states[:staged]):
            problems.append(f"hidden rows 0..{staged} (the graph's) were written eagerly")
    if staged < n:
        want = bench.reference_rows(staged, n) @ bench.weight
        got = owner.hidden_states[staged:n]
        if not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
            problems.append(f"hidden rows {staged}..{n} differ from the projected aux reference "
                            f"(max abs diff {float((got - want).abs().max()):.3g})")
        if bench.projection.calls != 1:
            problems.append(f"projection called {bench.projection.calls} times, expected 1")
    elif bench.projection.calls:
        problems.append("projection called although every row was staged for the graph")
    if not _untouched(torch, owner.hidden_states[n:]):
        problems.append(f"hidden rows past num_tokens={n} were written")
    if problems:
        return CaseResult(name, False, "; ".join(problems))
    eager = n - staged
    return CaseResult(name, True, f"num_tokens={n}, num_graph_tokens={graph_tokens}: {staged} "
                     f"rows staged, {eager} rows projected, matching the reference; the "
                     "poison residual was never read")


def negative_control_case(torch, consumer) -> CaseResult:
    name = C_NEGATIVE
    if consumer is None:
        return CaseResult(name, False, f"{CONSUMER_CLASS}.{CONSUMER_METHOD} not resolved")
    tripped: list[str] = []
    for aux in (None, []):
        bench = ConsumerBench(torch, consumer, staging=False)
        reads: list[str] = []
        poison = make_poison(torch, bench.max_tokens, bench.draft_hidden, reads)
        try:
            bench.call(11, poison, aux, 0)
        except PoisonRead:
            pass
        except Exception as exc:
            return CaseResult(name, False, f"aux={aux!r}: consumer raised "
                             f"{type(exc).__name__} instead of reading the residual: {exc}")
        if not reads:
            return CaseResult(name, False, f"aux={aux!r}: the consumer did not read the residual, "
                             "so the poison proves nothing (or the fallback changed)")
        tripped.append(f"aux={aux!r} tripped via {reads[0]}")
        # The same call with a plain residual copies it: the fallback really uses it.
        bench = ConsumerBench(torch, consumer, staging=False)
        residual = torch.arange(bench.max_tokens * bench.draft_hidden, dtype=torch.float32)
        residual = residual.reshape(bench.max_tokens, bench.draft_hidden)
        bench.call(11, residual, aux, 0)
        if not torch.equal(bench.owner.hidden_states[:11], residual[:11]):
            return CaseResult(name, False, f"aux={aux!r}: the residual fallback did not copy "
                             "last_hidden_states")
    return CaseResult(name, True, "without aux states the consumer reads the residual and the "
                     f"poison trips ({'; '.join(tripped)})")


def drafter_fallback_case(torch, sources: Sources) -> CaseResult:
    name = C_DRAFTER
    try:
        fn_def = top_level_function(sources.module(DRAFTER_FILE), DRAFTER_FN)
        if fn_def is None:
            raise Missing(f"{DRAFTER_FN} not found in {DRAFTER_FILE}")
        fn = compile_function(fn_def, {"torch": torch}, DRAFTER_FILE)
    except Missing as exc:
        return CaseResult(name, False, str(exc))
    hidden = torch.randn(5, 4, generator=torch.Generator().manual_seed(7))
    buffer = torch.randn(9, 16, generator=torch.Generator().manual_seed(8))
    no_hook = Obj()
    no_buffer = Obj(get_mtp_target_hidden_states=lambda: None)
    with_buffer = Obj(get_mtp_target_hidden_states=lambda: buffer)
    problems = []
    try:
        if fn(no_buffer, hidden) is not hidden:
            problems.append("buffer absent (hook returns None): did not return the regular "
                            "hidden states")
        if fn(no_hook, hidden) is not hidden:
            problems.append("model without the hook: did not return the regular hidden states")
        got = fn(with_buffer, hidden)
        if not (isinstance(got, torch.Tensor) and got.shape == (5, 16)
                and torch.equal(got, buffer[:5])):
            problems.append("buffer present: did not return its first num_tokens rows")
    except Exception as exc:
        problems.append(f"raised {type(exc).__name__}: {exc}")
    if problems:
        return CaseResult(name, False, "; ".join(problems))
    return CaseResult(name, True, "buffer absent -> the regular hidden states; buffer present "
                     "-> its first num_tokens rows")

# --- cases: the rest of DSparkSpeculator ----------------------------------------------
def dspark_mro(sources: Sources) -> list[tuple[str, ast.ClassDef]]:
    """DSparkSpeculator and its vLLM bases, in method-resolution order (single inheritance
    chains, as in 0.33.0), each with the installed file defining it."""
    out: list[tuple[str, ast.ClassDef]] = []

    def walk(rel: str, name: str, depth: int) -> None:
        if depth > 12:
            raise Missing(f"base-class chain of {name} is too deep to resolve")
        tree = sources.module(rel)
        cls = class_def(tree, name)
        if cls is None:
            imported = _import_map(tree, rel).get(name)
            target = sources.module_file(imported[0]) if imported else None
            if not target or not imported:
                raise Missing(f"class {name} is not defined or imported in {rel}")
            walk(target, imported[1], depth + 1)
            return
        if any(r == rel and c.name == name for r, c in out):
            return
        out.append((rel, cls))
        imports = _import_map(tree, rel)
        for base in cls.bases:
            if not isinstance(base, ast.Name):
                continue
            if class_def(tree, base.id) is not None:
                walk(rel, base.id, depth + 1)
            elif base.id in imports and sources.module_file(imports[base.id][0]):
                walk(rel, base.id, depth + 1)

    walk(CONSUMER_FILE, CONSUMER_CLASS, 0)
    return out


def resolved_methods(mro) -> dict[str, tuple[str, str, ast.FunctionDef]]:
    found: dict[str, tuple[str, str, ast.FunctionDef]] = {}
    for rel, cls in mro:
        for node in cls.body:
            if isinstance(node, ast.FunctionDef) and node.name not in found:
                found[node.name] = (rel, cls.name, node)
    return found


def _params(fn: ast.FunctionDef) -> set[str]:
    a = fn.args
    return {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs] if x is not None}


def _parents(root: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(root) for child in ast.iter_child_nodes(node)}


def residual_passing_case(methods) -> CaseResult:
    """Every method that receives the residual (the drafter's last_hidden_states) either is
    a consumer run with the poison, or only passes it to one."""
    name = C_PASSES
    problems, receivers = [], []
    for mname, (rel, cname, fn) in sorted(methods.items()):
        if RESIDUAL_PARAM not in _params(fn):
            continue
        receivers.append(f"{cname}.{mname}")
        if mname in CHECKED_CONSUMERS:
            continue
        parents = _parents(fn)
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Name) and node.id == RESIDUAL_PARAM):
                continue
            parent = parents.get(node)
            if isinstance(parent, ast.keyword):
                parent = parents.get(parent)
            ok = (isinstance(node.ctx, ast.Load) and isinstance(parent, ast.Call)
                  and node is not parent.func
                  and isinstance(parent.func, ast.Attribute)
                  and isinstance(parent.func.value, ast.Name) and parent.func.value.id == "self"
                  and parent.func.attr in CHECKED_CONSUMERS)
            if not ok:
                problems.append(f"{rel}:{node.lineno} {cname}.{mname} uses {RESIDUAL_PARAM} "
                                f"other than by passing it to {' or '.join(CHECKED_CONSUMERS)}")
    if not receivers:
        return CaseResult(name, False, f"no method of {CONSUMER_CLASS} receives {RESIDUAL_PARAM}")
    if problems:
        return CaseResult(name, False, "; ".join(problems))
    return CaseResult(name, True, f"{', '.join(receivers)} receive the residual; all but "
                     f"{', '.join(CHECKED_CONSUMERS)} only pass it on")


class SpeculatorBench:
    """The installed DSparkSpeculator methods on a synthetic instance: aux tensors, a stub
    projection, draft buffers; context-K/V precompute and metadata updates recorded."""

    def __init__(self, torch, methods: dict[str, object], pad_slot: int) -> None:
        gen = torch.Generator().manual_seed(4321)
        self.torch = torch
        self.max_tokens, self.aux_width, self.num_aux, self.draft_hidden = 16, 5, 3, 6
        self.aux = [torch.randn(self.max_tokens, self.aux_width, generator=gen)
                    for _ in range(self.num_aux)]
        self.weight = torch.randn(self.num_aux * self.aux_width, self.draft_hidden, generator=gen)
        self.projection = StubProjection(self.weight)
        self.precomputed: list[tuple[int, int]] = []
        bench = self

        def _precompute_context_kv(self, start, end, dummy_run=False):
            bench.precomputed.append((start, end))

        cls = type("DSparkUnderProbe", (), {
            **methods,
            "_precompute_context_kv": _precompute_context_kv,
            "_update_draft_decode_metadata": lambda self, *a, **k: None,
        })
        self.spec = cls()
        self.spec.__dict__.update(
            model=self.projection,
            hidden_states=torch.full((self.max_tokens, self.draft_hidden), SENTINEL),
            _aux_staging=torch.full((self.max_tokens, self.num_aux * self.aux_width), SENTINEL),
            max_num_tokens=self.max_tokens, num_speculative_steps=3, max_num_reqs=4,
            _num_rejected=torch.zeros(4, dtype=torch.int32),
            _context_slot_mappings=torch.zeros(1, self.max_tokens, dtype=torch.int64),
            target_input_buffers=Obj(query_start_loc=torch.zeros(5, dtype=torch.int32)),
            supports_decode_metadata_update=False,
        )
        self.pad_slot = pad_slot

    def reference(self, start: int, stop: int):
        torch = self.torch
        rows = [torch.stack([h[r, c] for h in self.aux for c in range(self.aux_width)])
                for r in range(start, stop)]
        return torch.stack(rows) if rows else torch.empty(0, self.num_aux * self.aux_width)


def _pad_slot_id(sources: Sources) -> int:
    # DFlash fills unused context slots with PAD_SLOT_ID (vllm/v1/attention/backends/utils.py).
    try:
        node = module_defines(sources.module("vllm/v1/attention/backends/utils.py"), "PAD_SLOT_ID")
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.UnaryOp):
            return -int(node.value.operand.value)  # type: ignore[attr-defined]
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            return int(node.value.value)
    except Exception:
        pass
    return -1


def compile_methods(torch, methods, pad_slot: int) -> dict[str, object]:
    namespace: dict[str, object] = {"torch": torch, "PAD_SLOT_ID": pad_slot}
    return {name: compile_function(fn, dict(namespace), rel)
            for name, (rel, _c, fn) in methods.items()
            if name in (CONSUMER_METHOD, REPLAY_METHOD, GRAPH_FORWARD_METHOD,
                        "_num_graph_context_tokens", "prepare_context_anchor")}


def replay_case(torch, compiled, pad_slot: int) -> CaseResult:
    name = C_REPLAY
    if REPLAY_METHOD not in compiled:
        return CaseResult(name, False, f"{CONSUMER_CLASS}.{REPLAY_METHOD} not resolved")
    done = []
    for n, dummy in ((11, False), (14, False), (11, True)):
        bench = SpeculatorBench(torch, compiled, pad_slot)
        reads: list[str] = []
        poison = make_poison(torch, bench.max_tokens, bench.draft_hidden, reads)
        batch = Obj(num_reqs=3, num_tokens=n)
        label = f"num_tokens={n}, 3 graph reqs, dummy_run={dummy}"
        try:
            getattr(bench.spec, REPLAY_METHOD)(batch, 3, poison, bench.aux,
                                               torch.zeros(3, dtype=torch.int32), dummy)
        except PoisonRead as exc:
            return CaseResult(name, False, f"{label}: {exc}: DSpark must not read the MTP residual")
        except Exception as exc:
            return CaseResult(name, False, f"{label}: raised {type(exc).__name__}: {exc}")
        if reads:
            return CaseResult(name, False, f"{label}: the residual was read ({reads}), error swallowed")
        spec = bench.spec
        staged = min(n, spec._num_graph_context_tokens(3))
        if not torch.equal(spec._aux_staging[:staged], bench.reference(0, staged)):
            return CaseResult(name, False, f"{label}: staged rows differ from the aux states")
        if staged < n:
            want = bench.reference(staged, n) @ bench.weight
            if not torch.allclose(spec.hidden_states[staged:n], want, rtol=1e-5, atol=1e-5):
                return CaseResult(name, False, f"{label}: rows past the graph's are not the projected aux states")
        done.append(f"{label}: {staged} staged, {n - staged} projected")
    return CaseResult(name, True, "; ".join(done) + "; the poison residual was never read")


def graph_forward_case(torch, compiled, methods, pad_slot: int) -> CaseResult:
    name = C_CAPTURE
    if GRAPH_FORWARD_METHOD not in compiled or REPLAY_METHOD not in compiled:
        return CaseResult(name, False, f"{CONSUMER_CLASS}.{GRAPH_FORWARD_METHOD} not resolved")
    rel, cname, fn = methods[GRAPH_FORWARD_METHOD]
    if RESIDUAL_PARAM in _params(fn):
        return CaseResult(name, False, f"{cname}.{GRAPH_FORWARD_METHOD} ({rel}) receives "
                         f"{RESIDUAL_PARAM}: the captured graph would read the residual")
    bench = SpeculatorBench(torch, compiled, pad_slot)
    poison = make_poison(torch, bench.max_tokens, bench.draft_hidden, [])
    try:
        getattr(bench.spec, REPLAY_METHOD)(Obj(num_reqs=3, num_tokens=11), 3, poison, bench.aux,
                                           torch.zeros(3, dtype=torch.int32), False)
        getattr(bench.spec, GRAPH_FORWARD_METHOD)(3, None)
    except Exception as exc:
        return CaseResult(name, False, f"raised {type(exc).__name__}: {exc}")
    want = bench.reference(0, 11) @ bench.weight
    if not torch.allclose(bench.spec.hidden_states[:11], want, rtol=1e-5, atol=1e-5):
        return CaseResult(name, False, "the graph's context rows are not the staged aux states "
                         "through the draft projection")
    return CaseResult(name, True, f"{cname}.{GRAPH_FORWARD_METHOD} ({rel}) takes no residual and "
                     "fills the graph's context rows from the staged aux states (11 rows match)")

# --- census: every reference to the buffer, its accessor and the drafter helper ------
class Ref:
    def __init__(self, rel: str, line: int, function: str, cls: str | None, symbol: str,
                 kind: str, none_safe: bool, why: str) -> None:
        self.rel, self.line, self.function, self.cls = rel, line, function, cls
        self.symbol, self.kind, self.none_safe, self.why = symbol, kind, none_safe, why
        self.reached, self.reach_why = True, ""

    @property
    def failing(self) -> bool:
        return self.reached and not self.none_safe

    def as_json(self) -> dict[str, object]:
        verdict = ("FAIL: unguarded reader on the DSpark V2 path" if self.failing else
                   "ok" if self.reached else "not reached")
        return {"file": self.rel, "line": self.line, "function": self.function,
                "symbol": self.symbol, "kind": self.kind, "reached": self.reached,
                "none_safe": self.none_safe,
                "verdict": f"{verdict}: {self.why}; {self.reach_why}"}


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _same(a: ast.AST, b: ast.AST) -> bool:
    return ast.dump(a) == ast.dump(b)


def _none_compare(test: ast.AST, expr: ast.AST, op) -> bool:
    return (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], op)
            and ((_same(test.left, expr) and _is_none(test.comparators[0]))
                 or (_is_none(test.left) and _same(test.comparators[0], expr))))


def implies_not_none(test: ast.AST, expr: ast.AST) -> bool:
    if _none_compare(test, expr, ast.IsNot) or _same(test, expr):
        return True
    return isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And) and any(
        implies_not_none(v, expr) for v in test.values)


def implies_none(test: ast.AST, expr: ast.AST) -> bool:
    if _none_compare(test, expr, ast.Is):
        return True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _same(test.operand, expr):
        return True
    return isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) and any(
        implies_none(v, expr) for v in test.values)


def _terminates(body: list[ast.stmt]) -> bool:
    return bool(body) and isinstance(body[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


def guarded(node: ast.AST, expr: ast.AST, parents, stop: ast.AST) -> bool:
    """Whether `node` only runs when `expr` is not None: inside `if expr is not None:` (or
    the else of `if expr is None:`), after `expr is not None and ...`, or after an early
    exit `if expr is None: return` / `assert expr is not None` in an enclosing block."""
    child, parent = node, parents.get(node)
    while parent is not None and child is not stop:
        if isinstance(parent, (ast.If, ast.While, ast.IfExp)):
            body = parent.body if isinstance(parent.body, list) else [parent.body]
            orelse = parent.orelse if isinstance(parent.orelse, list) else [parent.orelse]
            if child in body and implies_not_none(parent.test, expr):
                return True
            if child in orelse and implies_none(parent.test, expr):
                return True
        if isinstance(parent, ast.BoolOp) and isinstance(parent.op, ast.And):
            idx = parent.values.index(child) if child in parent.values else 0
            if any(implies_not_none(v, expr) for v in parent.values[:idx]):
                return True
        for field in ("body", "orelse", "finalbody"):
            block = getattr(parent, field, None)
            if isinstance(block, list) and child in block:
                for prior in block[: block.index(child)]:
                    if isinstance(prior, ast.If) and implies_none(prior.test, expr) and _terminates(prior.body):
                        return True
                    if isinstance(prior, ast.Assert) and implies_not_none(prior.test, expr):
                        return True
        child, parent = parent, parents.get(parent)
    return False


PASS_THROUGH = (ACCESSOR,)


def value_safe(node: ast.AST, fn: ast.AST | None, parents, depth: int = 0) -> tuple[bool, str]:
    """Whether a value that may be None (the buffer, or what the accessor returns) is only
    used where None is handled."""
    if depth > 6:
        return False, "aliased too deeply to follow"
    stop = fn if fn is not None else node
    if guarded(node, node, parents, stop):
        return True, "guarded by a None check"
    parent = parents.get(node)
    if isinstance(parent, ast.Compare) and any(_is_none(c) for c in [parent.left, *parent.comparators]):
        return True, "compared with None (the guard itself)"
    if isinstance(parent, ast.Return):
        fname = getattr(fn, "name", "")
        if fname in PASS_THROUGH:
            return True, f"returned by the accessor {fname} (its callers are in the census)"
        return False, f"returned by {fname or 'module code'}, whose callers are not checked"
    if (isinstance(parent, ast.Assign) and len(parent.targets) == 1
            and isinstance(parent.targets[0], ast.Name) and fn is not None):
        alias = parent.targets[0].id
        uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == alias
                and isinstance(n.ctx, ast.Load) and n.lineno >= parent.lineno]
        for use in uses:
            ok, why = value_safe(use, fn, parents, depth + 1)
            if not ok:
                return False, f"alias {alias} at line {use.lineno}: {why}"
        return True, f"alias {alias}: every use is None-safe"
    return False, "used without a None check"


def callable_safe(node: ast.AST, fn, parents, depth: int = 0) -> tuple[bool, str]:
    """A reference yielding the accessor (a bound method, or getattr's callable-or-default):
    each call's result must be None-safe."""
    parent = parents.get(node)
    if isinstance(parent, ast.Call) and parent.func is node:
        return value_safe(parent, fn, parents, depth)
    if isinstance(parent, ast.Compare) and any(_is_none(c) for c in [parent.left, *parent.comparators]):
        return True, "compared with None"
    if (isinstance(parent, ast.Assign) and len(parent.targets) == 1
            and isinstance(parent.targets[0], ast.Name) and fn is not None and depth < 6):
        alias = parent.targets[0].id
        for use in [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == alias
                    and isinstance(n.ctx, ast.Load) and n.lineno >= parent.lineno]:
            ok, why = callable_safe(use, fn, parents, depth + 1)
            if not ok:
                return False, f"alias {alias} at line {use.lineno}: {why}"
        return True, f"alias {alias}: every call's result is None-safe"
    return False, "the accessor is used other than by calling it"


def classify(node: ast.AST, symbol: str, fn, parents) -> tuple[str, bool, str] | None:
    parent = parents.get(node)
    if isinstance(node, ast.FunctionDef):
        return "definition", True, "defines it (its body's references are listed)"
    if isinstance(node, ast.alias):
        return "import", True, "imports it"
    if isinstance(node, ast.Constant):
        if not (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Name)
                and len(parent.args) >= 2 and parent.args[1] is node):
            return None  # a docstring or message that merely names it
        call = parent.func.id
        if call == "hasattr":
            return "existence check", True, "hasattr only checks that it exists"
        if call != "getattr":
            return "string", False, f"passed to {call}(), not followed"
        if symbol == BUFFER_ATTR:
            ok, why = value_safe(parent, fn, parents)
            return "read (getattr)", ok, why
        if symbol == ACCESSOR:
            ok, why = callable_safe(parent, fn, parents)
            return "accessor (getattr)", ok, why
        return "string", True, "names the helper"
    if symbol == DRAFTER_FN:
        if isinstance(parent, ast.Call) and parent.func is node:
            return "helper call", True, "goes through the helper's fallback (checked by the drafter case)"
        return "helper reference", False, "the helper is used other than by calling it"
    if isinstance(node, ast.Attribute) and symbol == BUFFER_ATTR:
        if isinstance(node.ctx, (ast.Store, ast.Del)):
            return "assignment", True, "writes the attribute (allocation or None)"
        ok, why = value_safe(node, fn, parents)
        return "read", ok, why
    if isinstance(node, ast.Attribute) and symbol == ACCESSOR:
        ok, why = callable_safe(node, fn, parents)
        return "accessor call", ok, why
    if isinstance(node, ast.Name) and symbol == ACCESSOR:
        ok, why = callable_safe(node, fn, parents)
        return "accessor call", ok, why
    return None


def scan_file(rel: str, tree: ast.Module) -> list[Ref]:
    parents = _parents(tree)
    refs: list[Ref] = []

    def enclosing(node: ast.AST):
        fn, cls, names = None, None, []
        cur = parents.get(node) if not isinstance(node, ast.FunctionDef) else parents.get(node)
        while cur is not None:
            if isinstance(cur, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fn = fn or cur
                names.append(cur.name)
            elif isinstance(cur, ast.ClassDef):
                cls = cls or cur.name
                names.append(cur.name)
            cur = parents.get(cur)
        return fn, cls, ".".join(reversed(names)) or "<module>"

    for node in ast.walk(tree):
        symbol = None
        if isinstance(node, ast.Attribute) and node.attr in CENSUS_SYMBOLS:
            symbol = node.attr
        elif isinstance(node, ast.Name) and node.id in CENSUS_SYMBOLS:
            symbol = node.id
        elif isinstance(node, ast.Constant) and node.value in CENSUS_SYMBOLS:
            symbol = node.value
        elif isinstance(node, ast.FunctionDef) and node.name in CENSUS_SYMBOLS:
            symbol = node.name
        elif isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in CENSUS_SYMBOLS:
                    _f, cls, where = enclosing(node)
                    refs.append(Ref(rel, node.lineno, where, cls, alias.name, "import", True, "imports it"))
            continue
        if symbol is None:
            continue
        fn, cls, where = enclosing(node)
        if isinstance(node, ast.FunctionDef):
            where = f"{where}.{node.name}" if where != "<module>" else node.name
        found = classify(node, symbol, fn, parents)
        if found is None:
            continue
        kind, ok, why = found
        refs.append(Ref(rel, getattr(node, "lineno", 0), where, cls, symbol, kind, ok, why))
    return refs


def reach(ref: Ref, *, skipping_files: set[str], mro_classes: set[tuple[str, str]]) -> tuple[bool, str]:
    """Whether the reference can run in a DSpark server on Model Runner V2 whose DeepSeek V4
    model left the buffer None. Conservative: anything not ruled out is reached."""
    rel = ref.rel
    if rel.startswith("vllm/benchmarks/"):
        return False, "benchmark code, not the serving path"
    if rel.startswith("vllm/v1/worker/") and not rel.startswith(V2_PACKAGE) and "model_runner" in rel:
        return False, "Model Runner V1 (the buffer is skipped only on V2)"
    if rel.startswith(MODEL_DIRS):
        if rel in skipping_files or rel.startswith(MODEL_WRAPPERS):
            return True, "the DeepSeek V4 model whose buffer may be skipped (or its wrapper)"
        return False, "another model implementation: its own buffer, never skipped by the patch"
    if rel.startswith(SPEC_DECODE_PACKAGE) and ref.cls is not None:
        sub = rel[len(SPEC_DECODE_PACKAGE):]
        if "/" in sub and (rel, ref.cls) not in mro_classes:
            return False, f"{ref.cls} is not in {CONSUMER_CLASS}'s bases (another speculator)"
    if rel.startswith(V2_PACKAGE):
        return True, "Model Runner V2 / DSpark speculator code"
    return True, "not ruled out, so counted as reached"


def run_census(sources: Sources, mro_classes: set[tuple[str, str]]) -> tuple[list[Ref], list[str]]:
    refs: list[Ref] = []
    problems: list[str] = []
    needles = [s.encode() for s in CENSUS_SYMBOLS]
    skipping: set[str] = set()
    root = sources.site / "vllm"
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        data = path.read_bytes()
        rel = path.relative_to(sources.site).as_posix()
        if DECISION_FN.encode() in data:
            skipping.add(rel)
        if not any(n in data for n in needles):
            continue
        try:
            tree = ast.parse(data, filename=rel)
        except SyntaxError as exc:
            problems.append(f"{rel}: does not parse ({exc.msg}, line {exc.lineno})")
            continue
        refs.extend(scan_file(rel, tree))
    for ref in refs:
        ref.reached, ref.reach_why = reach(ref, skipping_files=skipping, mro_classes=mro_classes)
    return refs, problems


def census_case(refs: list[Ref], problems: list[str]) -> CaseResult:
    bad = [r for r in refs if r.failing]
    if bad or problems:
        named = [f"{r.rel}:{r.line} {r.function} ({r.symbol}, {r.kind}): {r.why}" for r in bad]
        return CaseResult(C_CENSUS, False, "; ".join([*named, *problems]))
    reached = [r for r in refs if r.reached]
    return CaseResult(C_CENSUS, True, f"{len(refs)} references, {len(reached)} on the path, "
                     "every one None-safe (see the census)")


def forward_case(refs: list[Ref]) -> CaseResult:
    site = [r for r in refs if r.rel == MODEL_FILE and r.function == f"{MODEL_CLASS}.forward"
            and r.symbol == BUFFER_ATTR]
    if not site:
        return CaseResult(C_FORWARD, False, f"no reference to {BUFFER_ATTR} in "
                         f"{MODEL_CLASS}.forward ({MODEL_FILE}): the census cannot vouch for the copy")
    bad = [r for r in site if not r.none_safe]
    if bad:
        return CaseResult(C_FORWARD, False, "; ".join(f"{MODEL_FILE}:{r.line}: {r.why}" for r in bad))
    return CaseResult(C_FORWARD, True, f"{len(site)} references in {MODEL_CLASS}.forward, all "
                     "under `is not None`: " + ", ".join(f"line {r.line}" for r in site))


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
class _NoVllmImports:
    """Turns any import of vllm during the probe into an error (a case then fails)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "vllm" or fullname.startswith("vllm."):
            raise ImportError(f"the probe must not import {fullname}")
        return None


def _failed(exc: Exception) -> str:
    return str(exc) if isinstance(exc, Missing) else f"{type(exc).__name__}: {exc}"


def run_cases(site: Path, torch) -> tuple[list[CaseResult], list[Ref]]:
    sources = Sources(site)
    cases: list[CaseResult] = []

    try:
        envs, envs_problem = load_envs(sources)
    except Exception as exc:
        envs, envs_problem = Envs({}), f"reading {ENVS_FILE} failed: {_failed(exc)}"
    cases.append(envs_registration_case(envs, envs_problem))

    # What the installed tree declares: speculative methods, SpeculativeConfig's own
    # predicates, DSpark's classes and the resolver its speculator uses.
    spec_cls, methods = None, []
    try:
        spec_cls, methods = load_spec_config_class(sources)
        cases.append(CaseResult(C_METHODS, "dspark" in methods and "dflash" in methods,
                               f"{len(methods)} methods from {SPEC_METHOD_LITERAL} in "
                               f"{SPEC_CONFIG_FILE}: {', '.join(methods)}"))
    except Exception as exc:
        cases.append(CaseResult(C_METHODS, False, _failed(exc)))
    mro: list[tuple[str, ast.ClassDef]] = []
    mro_problem = ""
    try:
        mro = dspark_mro(sources)
    except Exception as exc:
        mro_problem = _failed(exc)
    resolver, resolver_file = None, ""
    try:
        resolver, resolver_file = runner_resolver(sources)
    except Exception as exc:
        resolver_file = _failed(exc)

    decision = None
    try:
        decision = Decision(sources, envs)
        if decision.problems:
            cases.append(CaseResult(C_IMPORTS, False, "; ".join(decision.problems)))
            decision = None
        else:
            cases.append(CaseResult(C_IMPORTS, True, f"{DECISION_FN} in {MODEL_FILE}: "
                                   + (", ".join(decision.resolved) or "no imported names")))
    except Exception as exc:
        cases.append(CaseResult(C_IMPORTS, False, _failed(exc)))
    if decision is None:
        cases.append(CaseResult(C_RESOLVER, False, f"{DECISION_FN} could not be loaded"))
    elif resolver is None:
        cases.append(CaseResult(C_RESOLVER, False, f"the runner's resolver: {resolver_file}"))
    elif decision.resolver_from is None:
        cases.append(CaseResult(C_RESOLVER, False, f"{DECISION_FN} does not call "
                               f"{AUX_RESOLVER_FN}: it bypasses the runner's layer-id resolver"))
    elif decision.resolver_from[0] != resolver_file:
        cases.append(CaseResult(C_RESOLVER, False, f"{DECISION_FN} takes {AUX_RESOLVER_FN} from "
                               f"{decision.resolver_from[0]}, the runner from {resolver_file}"))
    else:
        cases.append(CaseResult(C_RESOLVER, True, f"{AUX_RESOLVER_FN} from {resolver_file}, the "
                               f"module {CONSUMER_CLASS}'s bases import it from"))
    ready = decision is not None and spec_cls is not None and resolver is not None
    cases.extend(decision_cases(torch, decision if ready else None, spec_cls, methods, resolver))
    cases.append(invalid_flag_case(torch, decision if ready else None, spec_cls, methods))
    if spec_cls is None:
        cases.append(CaseResult(C_ALLOC, False, f"{SPEC_CONFIG_CLASS} could not be loaded"))
    else:
        cases.append(allocation_case(torch, sources, decision, envs, spec_cls))

    # The consumers: every DSparkSpeculator method that touches target hidden states.
    consumer = None
    resolved: dict[str, tuple[str, str, ast.FunctionDef]] = {}
    if mro:
        resolved = resolved_methods(mro)
    if CONSUMER_METHOD in resolved:
        rel, cname, fn_def = resolved[CONSUMER_METHOD]
        consumer = compile_function(fn_def, {"torch": torch}, rel)
        chain = " -> ".join(f"{c.name} ({r})" for r, c in mro[: [c.name for _r, c in mro].index(cname) + 1])
        cases.append(CaseResult(C_RESOLUTION, True, f"{CONSUMER_CLASS}.{CONSUMER_METHOD} from {chain}"))
    else:
        cases.append(CaseResult(C_RESOLUTION, False, mro_problem or
                               f"{CONSUMER_METHOD} is not defined on {CONSUMER_CLASS} or its bases"))
    for branch in ("ordinary", "partial-graph-staging", "all-staged"):
        cases.append(consumer_branch_case(torch, consumer, branch))
    cases.append(negative_control_case(torch, consumer))
    pad_slot = _pad_slot_id(sources)
    compiled = compile_methods(torch, resolved, pad_slot) if resolved else {}
    cases.append(replay_case(torch, compiled, pad_slot))
    cases.append(graph_forward_case(torch, compiled, resolved, pad_slot))
    cases.append(residual_passing_case(resolved) if resolved else
                 CaseResult(C_PASSES, False, mro_problem or f"{CONSUMER_CLASS} not resolved"))
    cases.append(drafter_fallback_case(torch, sources))

    # The census: every reader of the buffer in the installed tree.
    refs: list[Ref] = []
    try:
        refs, problems = run_census(sources, {(rel, c.name) for rel, c in mro})
        cases.append(forward_case(refs))
        cases.append(runner_case(refs))
        cases.append(census_case(refs, problems))
    except Exception as exc:
        for name in (C_FORWARD, C_RUNNER, C_CENSUS):
            cases.append(CaseResult(name, False, f"census failed: {_failed(exc)}"))

    loaded = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
    cases.append(CaseResult(C_NO_VLLM, not loaded,
                           f"vllm modules imported: {loaded}" if loaded else
                           "no vllm module was imported"))
    return cases, refs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="probe.py", description=f"CPU probe for the {PATCH_SET} patch set"
    )
    parser.add_argument("--site", required=True, help="site-packages folder holding vllm/")
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    site = Path(args.site)
    if not (site / "vllm").is_dir():
        print(f"probe.py: no vllm package under {site} (pass the site-packages folder)",
              file=sys.stderr)
        return 2
    try:
        import torch
    except Exception as exc:  # the image's interpreter lacks torch: an environment problem
        print(f"probe.py: torch is not importable: {exc}", file=sys.stderr)
        return 3
    sys.dont_write_bytecode = True
    guard = _NoVllmImports()
    sys.meta_path.insert(0, guard)
    try:
        cases, refs = run_cases(site, torch)
    finally:
        sys.meta_path.remove(guard)
    ok = all(c.ok for c in cases)
    print(json.dumps({"schema": SCHEMA, "ok": ok, "cases": [c.as_json() for c in cases],
                      "census": [r.as_json() for r in refs]}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
