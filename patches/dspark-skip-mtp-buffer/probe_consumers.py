"""The consumers of target hidden states on DSparkSpeculator, run with a poison residual."""

from __future__ import annotations

import ast

from probe_census import (
    Consumer,
    argument_of,
    is_super_call,
    live_definitions,
    loaded_names,
)
from probe_common import (
    AUX_PARAM,
    C_BRANCH,
    C_CAPTURE,
    C_DRAFTER,
    C_NEGATIVE,
    C_PASSES,
    C_REPLAY,
    CONSUMER_CLASS,
    CONSUMER_METHOD,
    DRAFTER_FILE,
    DRAFTER_FN,
    GRAPH_FORWARD_METHOD,
    REPLAY_METHOD,
    RESIDUAL_PARAM,
    CaseResult,
    Missing,
    Obj,
    Sources,
    compile_function,
    module_defines,
    not_present,
    params_of,
    parents_map,
    top_level_function,
)


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


# --- running the consumer: whole (a method of its own) or its choice as a slice ---------
GRAPH_NAMES = ("run_fullgraph", "_precompute_context_kv", "precompute_and_store_context_kv", REPLAY_METHOD)


def _is_self_hidden(node: ast.AST) -> bool:
    while isinstance(node, ast.Subscript):
        node = node.value
    return (isinstance(node, ast.Attribute) and node.attr == "hidden_states"
            and isinstance(node.value, ast.Name) and node.value.id == "self")


def _stores_hidden(stmt: ast.AST) -> bool:
    for node in ast.walk(stmt):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "copy_" and _is_self_hidden(node.func.value)):
            return True
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Subscript) and _is_self_hidden(t) for t in targets):
                return True
    return False


def _assigned(stmts) -> set[str]:
    return {n.id for s in stmts for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


class InlineSlice:
    """The top-level statements of an inline consumer that make the choice and store its
    result into self.hidden_states, with the earlier assignments they need."""

    def __init__(self, consumer: Consumer) -> None:
        import builtins

        fn, choice = consumer.fn, consumer.choice
        if choice is None:
            raise Missing(f"{consumer.describe()} makes no choice between {AUX_PARAM} and {RESIDUAL_PARAM}")
        body = fn.body
        top = next(i for i, stmt in enumerate(body) if any(n is choice for n in ast.walk(stmt)))
        self.unconditional = body[top] is choice
        end = next((j for j in range(top, len(body)) if _stores_hidden(body[j])), None)
        if end is None:
            raise Missing(f"{consumer.describe()}: nothing after the choice (line {choice.lineno}) "
                          "stores into self.hidden_states")
        chosen = list(range(top, end + 1))
        params = params_of(fn) | {a.arg for a in (fn.args.vararg, fn.args.kwarg) if a is not None}
        free = set().union(*(loaded_names(body[i]) for i in chosen)) - _assigned(body[i] for i in chosen)
        needed = free - params - {"torch"} - set(dir(builtins))
        for i in range(top - 1, -1, -1):
            stmt = body[i]
            if isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _assigned([stmt]) & needed:
                chosen.insert(0, i)
                needed = (needed - _assigned([stmt])) | (loaded_names(stmt) - params - {"torch"} - set(dir(builtins)))
        if needed:
            raise Missing(f"{consumer.describe()}: the choice needs {sorted(needed)}, which the probe cannot model")
        self.indices, self.top, self.end, self.consumer = chosen, top, end, consumer
        # Every graph replay and context-K/V store in the method comes after the stored rows.
        graph = [(i, n.attr if isinstance(n, ast.Attribute) else n.id) for i, stmt in enumerate(body)
                 for n in ast.walk(stmt)
                 if (isinstance(n, ast.Attribute) and n.attr in GRAPH_NAMES)]
        self.graph_before = [f"line {body[i].lineno} ({name})" for i, name in graph if i <= end]
        self.graph_after = sorted({body[i].lineno for i, _name in graph if i > end})

    def eager_before_graph(self) -> tuple[bool, str]:
        c = self.consumer
        where = f"{c.cname}.{c.name}"
        if not self.unconditional:
            return False, (f"the choice (line {c.choice.lineno}) is inside a branch of {where}: "
                           "a FULL-graph step may skip it and replay stale rows")
        if self.graph_before:
            return False, (f"{where} replays or stores context before its rows are combined: "
                           + ", ".join(self.graph_before))
        return True, (f"{where} combines every row at line {c.choice.lineno} unconditionally, before "
                      f"each graph replay and context-K/V store (lines {', '.join(map(str, self.graph_after))})")

    def compile(self, torch):
        fn = ast.parse(ast.unparse(self.consumer.fn)).body[0]
        assert isinstance(fn, ast.FunctionDef)
        fn.body = [fn.body[i] for i in self.indices]
        return compile_function(fn, {"torch": torch}, self.consumer.rel)


def consumer_runner(torch, consumer: Consumer):
    """A callable (owner, num_tokens, residual, aux, num_graph_tokens) running the consumer."""
    c = consumer
    if c.layout == "method":
        fn = compile_function(c.fn, {"torch": torch}, c.rel)
        names = [a.arg for a in [*c.fn.args.posonlyargs, *c.fn.args.args, *c.fn.args.kwonlyargs]][1:]

        def run_method(owner, n, residual, aux, graph_tokens):
            values = {"num_tokens": n, RESIDUAL_PARAM: residual, AUX_PARAM: aux, "num_graph_tokens": graph_tokens}
            return fn(owner, **{k: values[k] for k in names if k in values})

        return run_method
    part = InlineSlice(c)
    fn = part.compile(torch)
    names = [a.arg for a in [*c.fn.args.posonlyargs, *c.fn.args.args, *c.fn.args.kwonlyargs]][1:]

    def run_inline(owner, n, residual, aux, graph_tokens):
        batch = Obj(num_reqs=3, num_tokens=n, seq_lens_cpu_upper_bound=torch.full((4,), 8, dtype=torch.int32))
        values = {"input_batch": batch, RESIDUAL_PARAM: residual, AUX_PARAM: aux, "dummy_run": False}
        return fn(owner, **{k: values.get(k) for k in names})

    return run_inline


def consumer_branch_case(torch, consumer, branch: str, found: Consumer | None = None,
                         carrier: CaseResult | None = None, problem: str = "") -> CaseResult:
    """`consumer`: the runner (see consumer_runner); `found`: what it runs; `problem`: why
    there is none."""
    name = C_BRANCH[branch]
    if consumer is None:
        return CaseResult(name, False, problem or f"{CONSUMER_CLASS}.{CONSUMER_METHOD} not resolved")
    if branch != "ordinary" and found is not None and not found.staging:
        return not_present(name, f"{found.describe()} takes no num_graph_tokens: this release "
                           "stages no aux states for a FULL graph", carrier)
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


def negative_control_case(torch, consumer, problem: str = "") -> CaseResult:
    name = C_NEGATIVE
    if consumer is None:
        return CaseResult(name, False, problem or f"{CONSUMER_CLASS}.{CONSUMER_METHOD} not resolved")
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


def drafter_helper_present(sources: Sources) -> bool:
    """Whether the release has the drafter helper (0.32.0 and 0.33.0 do; 0.31.0 does not)."""
    try:
        return top_level_function(sources.module(DRAFTER_FILE), DRAFTER_FN) is not None
    except Missing:
        return False


def drafter_fallback_case(torch, sources: Sources, carrier: CaseResult | None = None, referenced: bool = True) -> CaseResult:
    """`carrier`: the census case, which carries the claim where the release has no helper;
    `referenced`: whether anything in the tree names the helper (then it must be there)."""
    name = C_DRAFTER
    if not drafter_helper_present(sources) and not referenced:
        return not_present(name, f"no {DRAFTER_FN} in {DRAFTER_FILE}: the runner reads the accessor "
                           "itself (see the runner case)", carrier)
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

def residual_passing_case(defs, consumer: Consumer | None, run_with_poison: set[str]) -> CaseResult:
    """Every live method that receives the residual (the drafter's last_hidden_states) is run
    with the poison (`run_with_poison`: the consumer when it is a method of its own, the graph
    replay preparation), or is the inline consumer using it only in its choice's fallback, or
    only passes it to another receiver (self.M(...) or super().M(...))."""
    name = C_PASSES
    problems, receivers = [], []
    live = live_definitions(defs)
    receiving = {fn.name for _r, _c, fn in live if RESIDUAL_PARAM in params_of(fn)}
    for rel, cname, fn in live:
        if RESIDUAL_PARAM not in params_of(fn):
            continue
        mname = fn.name
        receivers.append(f"{cname}.{mname}")
        if mname in run_with_poison and (consumer is None or consumer.fn is not fn or consumer.layout == "method"):
            continue
        inline_choice = consumer.choice if consumer is not None and consumer.fn is fn else None
        parents = parents_map(fn)
        for node in ast.walk(fn):
            if not (isinstance(node, ast.Name) and node.id == RESIDUAL_PARAM):
                continue
            if inline_choice is not None and any(node is n for s in inline_choice.orelse for n in ast.walk(s)):
                continue  # the choice's fallback: run by the consumer cases (and the negative control)
            call = argument_of(node, parents)
            ok = (isinstance(node.ctx, ast.Load) and call is not None and isinstance(call.func, ast.Attribute)
                  and call.func.attr in receiving
                  and ((isinstance(call.func.value, ast.Name) and call.func.value.id == "self")
                       or is_super_call(call)))
            if not ok:
                problems.append(f"{rel}:{node.lineno} {cname}.{mname} uses {RESIDUAL_PARAM} "
                                f"other than by passing it to {' or '.join(sorted(receiving - {mname}) or ['a checked consumer'])}")
    if not receivers:
        return CaseResult(name, False, f"no method of {CONSUMER_CLASS} receives {RESIDUAL_PARAM}")
    if problems:
        return CaseResult(name, False, "; ".join(problems))
    checked = sorted(run_with_poison & receiving)
    if consumer is not None and consumer.layout == "inline":
        checked.append(f"{consumer.name} (its choice, run as a slice)")
    return CaseResult(name, True, f"{', '.join(receivers)} receive the residual; all but "
                     f"{', '.join(checked)} only pass it on")


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


def replay_case(torch, compiled, pad_slot: int, carrier: CaseResult | None = None) -> CaseResult:
    name = C_REPLAY
    if REPLAY_METHOD not in compiled:
        if carrier is not None:
            return not_present(name, f"{CONSUMER_CLASS} and its bases define no {REPLAY_METHOD}: "
                               "nothing stages rows for a FULL replay", carrier)
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


def graph_forward_case(torch, compiled, methods, pad_slot: int, inline=None) -> CaseResult:
    """`inline`: the runner of an inline consumer (no aux staging): the graph's context step
    must then store the rows that consumer combined eagerly."""
    name = C_CAPTURE
    if GRAPH_FORWARD_METHOD not in compiled and inline is not None and "capture" in methods:
        # 0.31.0: capture hands the graph manager a context step of its own.
        rel, cname, fn = methods["capture"]
        safe = RESIDUAL_PARAM not in params_of(fn) and RESIDUAL_PARAM not in loaded_names(fn)
        carrier = CaseResult(f"graph capture: {cname}.capture ({rel}) never names {RESIDUAL_PARAM}", safe,
                             "its context step stores rows from self.hidden_states, which the consumer fills "
                             "eagerly from the aux states" if safe else f"{cname}.capture uses {RESIDUAL_PARAM}")
        return not_present(name, f"{CONSUMER_CLASS} and its bases define no {GRAPH_FORWARD_METHOD}", carrier)
    if GRAPH_FORWARD_METHOD not in compiled or (REPLAY_METHOD not in compiled and inline is None):
        return CaseResult(name, False, f"{CONSUMER_CLASS}.{GRAPH_FORWARD_METHOD} not resolved")
    rel, cname, fn = methods[GRAPH_FORWARD_METHOD]
    if RESIDUAL_PARAM in params_of(fn) or RESIDUAL_PARAM in loaded_names(fn):
        return CaseResult(name, False, f"{cname}.{GRAPH_FORWARD_METHOD} ({rel}) receives "
                         f"{RESIDUAL_PARAM}: the captured graph would read the residual")
    if inline is not None:
        return _graph_forward_inline(torch, compiled, pad_slot, inline, f"{cname}.{GRAPH_FORWARD_METHOD} ({rel})")
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


def _graph_forward_inline(torch, compiled, pad_slot: int, runner, where: str) -> CaseResult:
    name = C_CAPTURE
    bench = SpeculatorBench(torch, compiled, pad_slot)
    reads: list[str] = []
    poison = make_poison(torch, bench.max_tokens, bench.draft_hidden, reads)
    try:
        runner(bench.spec, 11, poison, bench.aux, 0)
        getattr(bench.spec, GRAPH_FORWARD_METHOD)(3, None)
    except Exception as exc:
        return CaseResult(name, False, f"raised {type(exc).__name__}: {exc}")
    if reads:
        return CaseResult(name, False, f"the residual was read ({reads})")
    num_context = bench.spec._num_graph_context_tokens(3)
    want = bench.reference(0, 11) @ bench.weight
    if not torch.allclose(bench.spec.hidden_states[:11], want, rtol=1e-5, atol=1e-5):
        return CaseResult(name, False, "the rows the graph's context step stores are not the aux states "
                          "through the draft projection")
    if (0, num_context) not in bench.precomputed:
        return CaseResult(name, False, f"{where} did not store the graph's {num_context} context rows "
                          f"(stored {bench.precomputed})")
    return CaseResult(name, True, f"no aux staging in this release: {where} takes no residual and stores "
                      f"context rows 0..{num_context} from self.hidden_states, which the consumer filled "
                      "eagerly from the aux states (11 rows match)")
