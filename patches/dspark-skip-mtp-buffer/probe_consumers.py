"""The consumers of target hidden states on DSparkSpeculator, run with a poison residual."""

from __future__ import annotations

import ast

from probe_common import (
    C_BRANCH,
    C_CAPTURE,
    C_DRAFTER,
    C_NEGATIVE,
    C_PASSES,
    C_REPLAY,
    CHECKED_CONSUMERS,
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

def residual_passing_case(methods) -> CaseResult:
    """Every method that receives the residual (the drafter's last_hidden_states) either is
    a consumer run with the poison, or only passes it to one."""
    name = C_PASSES
    problems, receivers = [], []
    for mname, (rel, cname, fn) in sorted(methods.items()):
        if RESIDUAL_PARAM not in params_of(fn):
            continue
        receivers.append(f"{cname}.{mname}")
        if mname in CHECKED_CONSUMERS:
            continue
        parents = parents_map(fn)
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
    if RESIDUAL_PARAM in params_of(fn):
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
