"""Consumer CPU probe for the dspark-skip-mtp-buffer patch set (standalone: stdlib + torch).

Run by the target's own interpreter, never importing vLLM (images may lack its GPU
libraries):

    PYTHON -B consumer_probe.py --site SITE_PACKAGES_DIR [--json]
    PYTHON -B -c "<this source>" --site SITE_PACKAGES_DIR

It reads the *installed* sources, extracts the functions it needs by AST and runs them
on CPU with synthetic configs and tensors:

- the patched decision function's full truth table (flag x method x runner x PP x aux),
  evaluating the flag through the real entry in vllm/envs.py;
- the allocation site in DeepseekV4Model.__init__ (skip + one INFO line, or allocate);
- DSparkSpeculator's hidden-state consumer (resolved through its bases in the installed
  files) in its three branches with a poison residual that fails on any read, compared
  with an independently computed reference, plus a negative control proving the poison
  trips when the consumer does read the residual;
- get_drafter_hidden_states falling back to the regular hidden states without the buffer.

Stdout: one JSON object {"schema", "ok", "cases": [{"name", "ok", "detail"}]}.
Exit 0 all cases pass, 1 any case failed (an unpatched tree fails the decision and
allocation cases), 2 bad usage, 3 torch not importable. Writes nothing to disk and
does not rely on __file__.
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
ENVS_FILE = "vllm/envs.py"
ENVS_TABLE = "environment_variables"
AUX_RESOLVER_FILE = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
AUX_RESOLVER_FN = "get_eagle3_aux_layers_from_config"
CONSUMER_FILE = "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py"
CONSUMER_CLASS = "DSparkSpeculator"
CONSUMER_METHOD = "_store_hidden_states"
DRAFTER_FILE = "vllm/v1/worker/gpu/spec_decode/utils.py"
DRAFTER_FN = "get_drafter_hidden_states"

# Synthetic DeepSeek V4 geometry for the truth table (V4 Flash has 43 target layers).
NUM_TARGET_LAYERS = 43
# The geometry the seed reports: 4096 tokens x 4096 hidden x hc_mult 4, bf16 -> 128 MiB.
REAL_ROWS, REAL_HC_DIM, REAL_MIB = 4096, 4 * 4096, "128.00"

# Zero-based DSpark target layer ids; DeepSeek V4 resolves them to capture-after ids (+1).
AUX_VARIANTS: dict[str, object] = {
    "valid": [1, 21, 41],
    "missing": None,
    "empty": [],
    "duplicate": [1, 1, 41],
    "out-of-range": [1, 21, NUM_TARGET_LAYERS],
    "non-int": [1.0, 21.0],
}
VALID_FLAGS = {"unset": None, "0": "0", "1": "1"}
INVALID_FLAGS = ("2", "true", "", "on")
METHODS = ("dspark", "mtp", "eagle3", "none")


class ProbeCase:
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


def resolve_method(
    sources: Sources, rel: str, cls_name: str, method: str, depth: int = 0
) -> tuple[ast.FunctionDef, list[str]]:
    """Find `method` on `cls_name` as Python would for single inheritance, following each
    base into the installed file that defines it. Returns the def and the chain walked."""
    if depth > 12:
        raise Missing(f"base-class chain of {cls_name} is too deep to resolve")
    tree = sources.module(rel)
    cls = class_def(tree, cls_name)
    if cls is None:
        imported = _import_map(tree, rel).get(cls_name)
        target = imported and sources.module_file(imported[0])
        if not target:
            raise Missing(f"class {cls_name} is not defined or imported in {rel}")
        return resolve_method(sources, target, imported[1], method, depth + 1)
    step = f"{cls_name} ({rel})"
    found = method_def(cls, method)
    if found is not None:
        return found, [step]
    imports = _import_map(tree, rel)
    for base in cls.bases:
        if not isinstance(base, ast.Name):
            continue
        if class_def(tree, base.id) is not None:
            where, name = rel, base.id
        elif base.id in imports:
            module, name = imports[base.id]
            where = sources.module_file(module)
            if where is None:
                continue  # a base outside site-packages (abc, torch): no vLLM method there
        else:
            continue
        try:
            fn, chain = resolve_method(sources, where, name, method, depth + 1)
        except Missing:
            continue
        return fn, [step, *chain]
    raise Missing(f"{cls_name}.{method} is not defined on {cls_name} or its bases ({rel})")


# --- synthetic vLLM objects -----------------------------------------------------------
class Obj:
    def __init__(self, **kw: object) -> None:
        self.__dict__.update(kw)


class SpecConfig(Obj):
    def use_dspark(self) -> bool:
        return self.method == "dspark"

    def use_eagle(self) -> bool:
        return self.method in ("eagle", "eagle3", "mtp", "dflash", "dspark")

    def uses_draft_model(self) -> bool:
        return self.method == "draft_model"


def make_vllm_config(*, method: str, v2: bool, pp: int, aux: object, rows: int, dtype):
    spec = None
    if method != "none":
        hf = Obj(model_type="deepseek_v4")
        if aux is not None:
            hf.dspark_target_layer_ids = aux
        spec = SpecConfig(method=method, draft_model_config=Obj(hf_config=hf))
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
    for key, value in zip(table.keys, table.values):
        if isinstance(key, ast.Constant) and key.value == FLAG:
            expr = ast.fix_missing_locations(ast.Expression(body=value))
            getter = eval(compile(expr, f"<{ENVS_FILE}:{FLAG}>", "eval"), namespace)
            return Envs({FLAG: getter}), None
    return Envs({}), f"{FLAG} is not registered in {ENVS_TABLE} ({ENVS_FILE})"


def load_decision(sources: Sources, envs: Envs):
    model = sources.module(MODEL_FILE)
    fn = top_level_function(model, DECISION_FN)
    if fn is None:
        raise Missing(
            f"{DECISION_FN} not found in {MODEL_FILE}: the {PATCH_SET} patch is not applied"
        )
    resolver = top_level_function(sources.module(AUX_RESOLVER_FILE), AUX_RESOLVER_FN)
    if resolver is None:
        raise Missing(f"{AUX_RESOLVER_FN} not found in {AUX_RESOLVER_FILE}")
    namespace: dict[str, object] = {"envs": envs}
    compile_function(resolver, namespace, AUX_RESOLVER_FILE)
    return compile_function(fn, namespace, MODEL_FILE)


# --- cases: the decision --------------------------------------------------------------
def expected_skip(flag: str, method: str, v2: bool, pp: int, aux_name: str) -> bool:
    return flag == "1" and method == "dspark" and v2 and pp == 1 and aux_name == "valid"


def _combinations():
    for method in METHODS:
        for v2 in (False, True):
            for pp in (1, 2):
                for aux_name, aux in AUX_VARIANTS.items():
                    yield method, v2, pp, aux_name, aux


def truth_table_case(torch, decision, flag_name: str, flag: str | None) -> ProbeCase:
    name = f"decision-flag-{flag_name}"
    wrong: list[str] = []
    total = 0
    for method, v2, pp, aux_name, aux in _combinations():
        total += 1
        cfg = make_vllm_config(
            method=method, v2=v2, pp=pp, aux=aux, rows=4096, dtype=torch.bfloat16
        )
        want = expected_skip(flag_name, method, v2, pp, aux_name)
        label = f"{method}/{'V2' if v2 else 'V1'}/PP{pp}/aux {aux_name}"
        try:
            with FlagEnv(flag):
                got = decision(cfg, NUM_TARGET_LAYERS)
        except Exception as exc:  # any raise is a wrong answer for a valid flag value
            wrong.append(f"{label}: raised {type(exc).__name__}: {exc}")
            continue
        if got is not want:
            wrong.append(f"{label}: returned {got!r}, expected {want!r}")
    if wrong:
        shown = "; ".join(wrong[:4])
        return ProbeCase(name, False, f"{len(wrong)}/{total} combinations wrong: {shown}")
    skips = sum(expected_skip(flag_name, *c[:4]) for c in _combinations())
    return ProbeCase(
        name, True, f"{total}/{total} combinations as expected ({skips} skip the buffer)"
    )


def invalid_flag_case(torch, decision) -> ProbeCase:
    name = "decision-flag-invalid"
    wrong: list[str] = []
    total = 0
    for value in INVALID_FLAGS:
        for method, v2, pp, _aux_name, aux in _combinations():
            total += 1
            cfg = make_vllm_config(
                method=method, v2=v2, pp=pp, aux=aux, rows=4096, dtype=torch.bfloat16
            )
            label = f"{FLAG}={value!r} {method}/{'V2' if v2 else 'V1'}/PP{pp}"
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
        shown = "; ".join(wrong[:4])
        return ProbeCase(name, False, f"{len(wrong)}/{total} combinations wrong: {shown}")
    return ProbeCase(
        name, True, f"{total}/{total} invalid-value combinations refused with an error "
        f"naming {FLAG} and the allowed values {list(FLAG_CHOICES)}"
    )


def envs_registration_case(envs: Envs, problem: str | None) -> ProbeCase:
    name = "envs-registration"
    if problem:
        return ProbeCase(name, False, f"{problem}: vLLM would warn (or fail with "
                         "--fail-on-environ-validation) on an unknown variable")
    seen: dict[str, object] = {}
    for label, value in (("unset", None), ("0", "0"), ("1", "1")):
        with FlagEnv(value):
            seen[label] = getattr(envs, FLAG)
    want = {"unset": False, "0": False, "1": True}
    if seen != want:
        return ProbeCase(name, False, f"{FLAG} parses as {seen}, expected {want}")
    return ProbeCase(name, True, f"{FLAG} registered in {ENVS_FILE}; unset/0/1 -> {seen}")


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


def run_allocation(torch, code, decision, envs, *, flag, method, pp, rows, hc_dim):
    logger = FakeLogger()
    self_obj = Obj(hc_dim=hc_dim)
    cfg = make_vllm_config(
        method=method, v2=True, pp=pp, aux=AUX_VARIANTS["valid"], rows=rows,
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


def allocation_case(torch, sources: Sources, decision, envs: Envs) -> ProbeCase:
    name = "allocation-site"
    try:
        stmts = _allocation_slice(sources)
    except Missing as exc:
        return ProbeCase(name, False, str(exc))
    module = ast.fix_missing_locations(ast.Module(body=stmts, type_ignores=[]))
    code = compile(module, f"<{MODEL_FILE}:{MODEL_CLASS}.__init__>", "exec")
    problems: list[str] = []
    try:
        buf, records = run_allocation(
            torch, code, decision, envs, flag="1", method="dspark", pp=1,
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
                torch, code, decision, envs, flag=flag, method=method, pp=pp,
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
        return ProbeCase(name, False, "; ".join(problems))
    return ProbeCase(name, True, f"skips with one INFO line ({skip_line!r}); allocates "
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


def consumer_branch_case(torch, consumer, branch: str) -> ProbeCase:
    name = f"consumer-{branch}"
    if consumer is None:
        return ProbeCase(name, False, f"{CONSUMER_CLASS}.{CONSUMER_METHOD} not resolved")
    n = 11
    graph_tokens = {"ordinary": 0, "partial-graph-staging": 4, "all-staged": 14}[branch]
    bench = ConsumerBench(torch, consumer, staging=branch != "ordinary")
    reads: list[str] = []
    poison = make_poison(torch, bench.max_tokens, bench.draft_hidden, reads)
    try:
        bench.call(n, poison, bench.aux, graph_tokens)
    except PoisonRead as exc:
        return ProbeCase(name, False, f"{exc}: DSpark must not read the MTP residual")
    except Exception as exc:
        return ProbeCase(name, False, f"consumer raised {type(exc).__name__}: {exc}")
    if reads:
        return ProbeCase(name, False, f"the MTP residual was read ({reads}) and the error swallowed")
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
        return ProbeCase(name, False, "; ".join(problems))
    eager = n - staged
    return ProbeCase(name, True, f"num_tokens={n}, num_graph_tokens={graph_tokens}: {staged} "
                     f"rows staged, {eager} rows projected, matching the reference; the "
                     "poison residual was never read")


def negative_control_case(torch, consumer) -> ProbeCase:
    name = "consumer-negative-control"
    if consumer is None:
        return ProbeCase(name, False, f"{CONSUMER_CLASS}.{CONSUMER_METHOD} not resolved")
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
            return ProbeCase(name, False, f"aux={aux!r}: consumer raised "
                             f"{type(exc).__name__} instead of reading the residual: {exc}")
        if not reads:
            return ProbeCase(name, False, f"aux={aux!r}: the consumer did not read the residual, "
                             "so the poison proves nothing (or the fallback changed)")
        tripped.append(f"aux={aux!r} tripped via {reads[0]}")
        # The same call with a plain residual copies it: the fallback really uses it.
        bench = ConsumerBench(torch, consumer, staging=False)
        residual = torch.arange(bench.max_tokens * bench.draft_hidden, dtype=torch.float32)
        residual = residual.reshape(bench.max_tokens, bench.draft_hidden)
        bench.call(11, residual, aux, 0)
        if not torch.equal(bench.owner.hidden_states[:11], residual[:11]):
            return ProbeCase(name, False, f"aux={aux!r}: the residual fallback did not copy "
                             "last_hidden_states")
    return ProbeCase(name, True, "without aux states the consumer reads the residual and the "
                     f"poison trips ({'; '.join(tripped)})")


def drafter_fallback_case(torch, sources: Sources) -> ProbeCase:
    name = "drafter-hidden-states-fallback"
    try:
        fn_def = top_level_function(sources.module(DRAFTER_FILE), DRAFTER_FN)
        if fn_def is None:
            raise Missing(f"{DRAFTER_FN} not found in {DRAFTER_FILE}")
        fn = compile_function(fn_def, {"torch": torch}, DRAFTER_FILE)
    except Missing as exc:
        return ProbeCase(name, False, str(exc))
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
        return ProbeCase(name, False, "; ".join(problems))
    return ProbeCase(name, True, "buffer absent -> the regular hidden states; buffer present "
                     "-> its first num_tokens rows")


# --- running ----------------------------------------------------------------------------
class _NoVllmImports:
    """Turns any import of vllm during the probe into an error (a case then fails)."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "vllm" or fullname.startswith("vllm."):
            raise ImportError(f"the probe must not import {fullname}")
        return None


def run_cases(site: Path, torch) -> list[ProbeCase]:
    sources = Sources(site)
    cases: list[ProbeCase] = []

    try:
        envs, envs_problem = load_envs(sources)
    except Exception as exc:
        envs, envs_problem = Envs({}), f"reading {ENVS_FILE} failed: {type(exc).__name__}: {exc}"
    cases.append(envs_registration_case(envs, envs_problem))

    decision = None
    try:
        decision = load_decision(sources, envs)
        cases.append(ProbeCase("decision-function-present", True,
                               f"{DECISION_FN} found in {MODEL_FILE}"))
    except Exception as exc:
        detail = str(exc) if isinstance(exc, Missing) else f"{type(exc).__name__}: {exc}"
        cases.append(ProbeCase("decision-function-present", False, detail))
    for flag_name, flag in VALID_FLAGS.items():
        if decision is None:
            cases.append(ProbeCase(f"decision-flag-{flag_name}", False,
                                   f"{DECISION_FN} missing: the {PATCH_SET} patch is not applied"))
        else:
            cases.append(truth_table_case(torch, decision, flag_name, flag))
    if decision is None:
        cases.append(ProbeCase("decision-flag-invalid", False,
                               f"{DECISION_FN} missing: the {PATCH_SET} patch is not applied"))
    else:
        cases.append(invalid_flag_case(torch, decision))
    cases.append(allocation_case(torch, sources, decision, envs))

    consumer = None
    try:
        fn_def, chain = resolve_method(sources, CONSUMER_FILE, CONSUMER_CLASS, CONSUMER_METHOD)
        consumer = compile_function(fn_def, {"torch": torch}, CONSUMER_FILE)
        cases.append(ProbeCase("consumer-resolution", True,
                               f"{CONSUMER_CLASS}.{CONSUMER_METHOD} from " + " -> ".join(chain)))
    except Exception as exc:
        cases.append(ProbeCase("consumer-resolution", False, f"{type(exc).__name__}: {exc}"))
    for branch in ("ordinary", "partial-graph-staging", "all-staged"):
        cases.append(consumer_branch_case(torch, consumer, branch))
    cases.append(negative_control_case(torch, consumer))
    cases.append(drafter_fallback_case(torch, sources))

    loaded = sorted(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))
    cases.append(ProbeCase("no-vllm-import", not loaded,
                           f"vllm modules imported: {loaded}" if loaded else
                           "no vllm module was imported"))
    return cases


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="consumer_probe", description=f"CPU probe for the {PATCH_SET} patch set"
    )
    parser.add_argument("--site", required=True, help="site-packages folder holding vllm/")
    parser.add_argument("--json", action="store_true", help="accepted; output is always JSON")
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 2 if exc.code else 0
    site = Path(args.site)
    if not (site / "vllm").is_dir():
        print(f"consumer_probe: no vllm package under {site} (pass the site-packages folder)",
              file=sys.stderr)
        return 2
    try:
        import torch
    except Exception as exc:  # the image's interpreter lacks torch: an environment problem
        print(f"consumer_probe: torch is not importable: {exc}", file=sys.stderr)
        return 3
    sys.dont_write_bytecode = True
    guard = _NoVllmImports()
    sys.meta_path.insert(0, guard)
    try:
        cases = run_cases(site, torch)
    finally:
        sys.meta_path.remove(guard)
    ok = all(c.ok for c in cases)
    print(json.dumps({"schema": SCHEMA, "ok": ok, "cases": [c.as_json() for c in cases]}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
