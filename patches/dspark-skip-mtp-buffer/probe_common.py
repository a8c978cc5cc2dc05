"""Shared pieces of the dspark-skip-mtp-buffer probe: names, case registry, reading sources.

Stdlib only. Bundled with the other probe_* modules into the one source the runner sends
(see probe.py); importable as a plain module when probe.py runs from this folder.
"""

from __future__ import annotations

import ast
import os
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
AUX_PARAM = "aux_hidden_states"
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

# Case names: each says the promise it guards. `case` registers each name, in the order the
# probe reports them; a registered case that no module reports fails ("not reported").
CASES: list[str] = []


def case(name: str) -> str:
    assert name not in CASES, name
    CASES.append(name)
    return name


C_FLAG = case(f"flag: {FLAG} is registered and parses unset/0/1 as off/off/on")
C_METHODS = case("decision: driven over every speculative method the installed tree declares")
C_IMPORTS = case("decision: its imports resolve in the installed tree")
C_RESOLVER = case("decision: uses the runner's own layer-id resolver")
C_FLAG_OFF = case("decision: flag unset or 0 keeps the buffer")
C_SKIP = case("decision: flag 1 skips for V2 DSpark, PP 1, valid layer ids")
C_DFLASH = case("decision: DFlash keeps the buffer")
C_OTHER = case("decision: every method other than dspark keeps the buffer")
C_V1 = case("decision: Model Runner V1 keeps the buffer")
C_PP = case("decision: pipeline parallel size 2 keeps the buffer")
C_BOUNDS = case("decision: layer ids 1..N skip, 0, N+1 and negative keep the buffer")
C_MALFORMED = case("decision: non-int, duplicate, empty or missing layer ids keep the buffer")
C_PREFERRED = case("decision: layer ids are the ones the runner resolves (preferred key, DFlash config, V4.1)")
C_INVALID = case("decision: an invalid flag value is a startup error naming the variable")
C_ALLOC = case("allocation: skips with one INFO line, allocates for flag off, MTP and PP 2")
# What the patch is for, whoever makes the decision (the patch's flag, or a release that ships
# the change in its own form): the case a `superseded` record in patch.toml names first.
C_EFFECT = case("effect: DSpark (V2, PP 1, valid aux layers) leaves the buffer unallocated; MTP, EAGLE3 and DFlash keep it")
C_RESOLUTION = case(f"consumer: {CONSUMER_METHOD} resolves through {CONSUMER_CLASS}'s bases")
C_BRANCH = {  # registered below, in this order
    "ordinary": "consumer: an eager step combines the aux states, never reads the residual",
    "partial-graph-staging":
        "consumer: partial FULL-graph staging stages and combines aux states, never reads the residual",
    "all-staged": "consumer: an all-staged step only stages aux states, never reads the residual",
}
for _branch_case in C_BRANCH.values():
    case(_branch_case)
C_NEGATIVE = case("consumer: without aux states it reads the residual (the poison is live)")
C_REPLAY = case(f"graph replay: {REPLAY_METHOD} never reads the residual")
C_CAPTURE = case(f"graph capture: {GRAPH_FORWARD_METHOD} combines the staged aux states")
C_PASSES = case(f"speculator: every DSpark method receiving {RESIDUAL_PARAM} only hands it to the checked consumers")
C_DRAFTER = case(f"drafter: {DRAFTER_FN} falls back to the regular hidden states without the buffer")
C_FORWARD = case(f"forward: copies into {BUFFER_ATTR} only when it is allocated")
C_RUNNER = case(f"runner: the V2 runner feeds the drafter only through {DRAFTER_FN}")
C_CENSUS = case(f"census: no unguarded reader of {BUFFER_ATTR} on the DSpark V2 path")
C_NO_VLLM = case("probe: never imports vllm")

class CaseResult:
    def __init__(self, name: str, ok: bool, detail: str) -> None:
        self.name, self.ok, self.detail = name, ok, detail

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "ok": self.ok, "detail": self.detail}


NOT_PRESENT = "not present in this release"


def not_present(name: str, what: str, carrier: CaseResult | None) -> CaseResult:
    """A case whose subject this release lacks: it says so, and passes only if the case (or
    check) carrying the claim in its place passes. Nothing passes silently."""
    if carrier is None:
        return CaseResult(name, False, f"{NOT_PRESENT}: {what}; nothing carries the claim in its place")
    verdict = "passes" if carrier.ok else "FAILS"
    return CaseResult(name, carrier.ok, f"{NOT_PRESENT}: {what}; the claim is carried by "
                      f"'{carrier.name}', which {verdict}: {carrier.detail}")


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


def import_map(tree: ast.Module, rel: str) -> dict[str, tuple[str, str]]:
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


def plain_imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> dotted module for `import a.b as c` (and `import a`)."""
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else alias.name.split(".")[0]
    return found


def params_of(fn: ast.FunctionDef) -> set[str]:
    a = fn.args
    return {x.arg for x in [*a.posonlyargs, *a.args, *a.kwonlyargs] if x is not None}


def walk_with_parents(root: ast.AST) -> tuple[list[ast.AST], dict[ast.AST, ast.AST]]:
    """Every node in `ast.walk`'s order (breadth first, fields in order), and each one's parent,
    in one pass: the census walks whole modules, and `ast.walk` with `iter_child_nodes` is a
    generator per node (under emulation, seconds per big module)."""
    nodes: list[ast.AST] = [root]
    parents: dict[ast.AST, ast.AST] = {}
    AST = ast.AST
    for node in nodes:  # grows while it is read: the queue of a breadth-first walk
        for name in node._fields:
            value = getattr(node, name, None)
            if isinstance(value, list):
                for item in value:
                    if isinstance(item, AST):
                        parents[item] = node
                        nodes.append(item)
            elif isinstance(value, AST):
                parents[value] = node
                nodes.append(value)
    return nodes, parents


def parents_map(root: ast.AST) -> dict[ast.AST, ast.AST]:
    return walk_with_parents(root)[1]
