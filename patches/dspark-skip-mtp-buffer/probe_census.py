"""The census: the installed tree's own structure, found by AST.

Who reads the buffer, its accessor and the drafter helper (each with a reach and None-safety
verdict); DSparkSpeculator's bases; the layer-id resolver the runner imports.
"""

from __future__ import annotations

import ast
import fnmatch
import os
from pathlib import Path

from probe_common import (
    ACCESSOR,
    AUX_PARAM,
    AUX_RESOLVER_FN,
    BUFFER_ATTR,
    C_CENSUS,
    C_FORWARD,
    CENSUS_SYMBOLS,
    CONSUMER_CLASS,
    CONSUMER_FILE,
    DECISION_FN,
    DRAFTER_FN,
    MODEL_CLASS,
    MODEL_DIRS,
    MODEL_FILE,
    MODEL_WRAPPERS,
    RESIDUAL_PARAM,
    SPEC_DECODE_PACKAGE,
    V2_PACKAGE,
    V2_RUNNER_FILE,
    CaseResult,
    Missing,
    Sources,
    class_def,
    compile_function,
    import_map,
    params_of,
    parents_map,
    top_level_function,
    walk_with_parents,
)


def _resolve_function(sources: Sources, rel: str, name: str, depth: int = 0) -> tuple[str, ast.FunctionDef] | None:
    """The top-level function `name` as module `rel` sees it: defined there, or imported."""
    tree = sources.module(rel)
    node = top_level_function(tree, name)
    if node is not None:
        return rel, node
    imported = import_map(tree, rel).get(name)
    where = sources.module_file(imported[0]) if imported else None
    if imported is None or where is None or depth > 4:
        return None
    return _resolve_function(sources, where, imported[1], depth + 1)


def _calls(fn: ast.AST, name: str) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == name
               for n in ast.walk(fn))


def resolver_sites(sources: Sources, mro) -> list[tuple[str, str]]:
    """Where the DSpark V2 path takes its layer-id resolver from: (the defining file, how).

    The V2 runner (model_runner.py) configures the target's aux layers through a function it
    imports whose module calls AUX_RESOLVER_FN (0.31.0-0.33.0: eagle3_utils'
    set_eagle3_aux_hidden_state_layers); where a class in DSparkSpeculator's bases imports the
    resolver itself (0.33.0's DFlashSpeculator sizes its aux staging with it), that is a
    second site. Every site must resolve to the same function.
    """
    sites: list[tuple[str, str]] = []
    runner = sources.module(V2_RUNNER_FILE)
    for local, (module, attr) in sorted(import_map(runner, V2_RUNNER_FILE).items()):
        where = sources.module_file(module)
        if where is None or not module.startswith("vllm."):
            continue
        found = _resolve_function(sources, where, attr)
        if found is None:
            continue
        frel, fn = found
        if attr == AUX_RESOLVER_FN:
            sites.append((frel, f"{V2_RUNNER_FILE} imports {AUX_RESOLVER_FN} from {frel}"))
        elif _calls(fn, AUX_RESOLVER_FN):
            resolved = _resolve_function(sources, frel, AUX_RESOLVER_FN)
            if resolved is not None:
                sites.append((resolved[0], f"{V2_RUNNER_FILE} imports {local} from {frel}, "
                              f"which calls {AUX_RESOLVER_FN} from {resolved[0]}"))
    for rel, cls in mro:
        if AUX_RESOLVER_FN in import_map(sources.module(rel), rel):
            resolved = _resolve_function(sources, rel, AUX_RESOLVER_FN)
            if resolved is not None:
                sites.append((resolved[0], f"{cls.name} ({rel}) imports {AUX_RESOLVER_FN} from {resolved[0]}"))
    return sites


def runner_resolver(sources: Sources, mro) -> tuple[object, str, str]:
    """The layer-id resolver the DSpark V2 path uses, compiled: (function, its file, how found)."""
    sites = resolver_sites(sources, mro)
    if not sites:
        raise Missing(f"neither {V2_RUNNER_FILE} nor a class in {CONSUMER_CLASS}'s bases reaches {AUX_RESOLVER_FN}")
    files = sorted({f for f, _how in sites})
    if len(files) > 1:
        raise Missing(f"the DSpark V2 path takes {AUX_RESOLVER_FN} from several modules: "
                      + "; ".join(how for _f, how in sites))
    where = files[0]
    node = top_level_function(sources.module(where), AUX_RESOLVER_FN)
    assert node is not None
    return compile_function(node, {}, where), where, "; ".join(how for _f, how in sites)


# --- DSparkSpeculator's consumer of target hidden states, found by structure ------------
def mro_definitions(mro) -> list[tuple[str, str, ast.FunctionDef]]:
    """Every method defined on DSparkSpeculator and its bases, in method-resolution order."""
    return [(rel, cls.name, node) for rel, cls in mro for node in cls.body if isinstance(node, ast.FunctionDef)]


def loaded_names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def choice_of(fn: ast.FunctionDef) -> ast.If | None:
    """The statement choosing between the aux states and the residual: an `if` testing
    AUX_PARAM whose branches use it or the residual, preferably the one with RESIDUAL_PARAM in a branch (a
    fallback that no longer reads the residual is still the choice: the negative control
    then fails)."""
    found = []
    for node in ast.walk(fn):
        if (isinstance(node, ast.If) and AUX_PARAM in loaded_names(node.test)
                and any({AUX_PARAM, RESIDUAL_PARAM} & loaded_names(s) for s in [*node.body, *node.orelse])):
            found.append(node)
    with_residual = [n for n in found if any(RESIDUAL_PARAM in loaded_names(s) for s in [*n.body, *n.orelse])]
    return (with_residual or found or [None])[0]


def is_super_call(call: ast.AST, name: str | None = None) -> bool:
    """`super().NAME(...)` (or `super(Cls, self).NAME(...)`)."""
    return (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and (name is None or call.func.attr == name)
            and isinstance(call.func.value, ast.Call) and isinstance(call.func.value.func, ast.Name)
            and call.func.value.func.id == "super")


def calls_super(fn: ast.FunctionDef) -> bool:
    return any(is_super_call(n, fn.name) for n in ast.walk(fn))


def live_definitions(defs) -> list[tuple[str, str, ast.FunctionDef]]:
    """The definitions DSpark can run: per name the first in MRO order, and the next one each
    time a live definition calls super() for its own name."""
    live = []
    names = []
    for _rel, _c, fn in defs:
        if fn.name not in names:
            names.append(fn.name)
    for name in names:
        chain = [d for d in defs if d[2].name == name]
        for d in chain:
            live.append(d)
            if not calls_super(d[2]):
                break
    return live


def argument_of(node: ast.AST, parents) -> ast.Call | None:
    parent = parents.get(node)
    if isinstance(parent, (ast.keyword, ast.Starred)):
        parent = parents.get(parent)
    if isinstance(parent, ast.Call) and node is not parent.func:
        return parent
    return None


def passes_to_super(fn: ast.FunctionDef) -> bool:
    """Whether `fn` uses the residual only as an argument of super().<its own name>(...), or
    never names it and hands its arguments on to super().<its own name>(*args, **kwargs)."""
    parents = parents_map(fn)
    uses = [n for n in ast.walk(fn) if isinstance(n, ast.Name) and n.id == RESIDUAL_PARAM]
    if not uses:
        return RESIDUAL_PARAM not in params_of(fn) and calls_super(fn)
    return all(
        isinstance(u.ctx, ast.Load) and is_super_call(argument_of(u, parents), fn.name) for u in uses)


# Parameters the consumer bench can supply when it calls a chooser method whole.
BENCH_PARAMS = {"self", "num_tokens", RESIDUAL_PARAM, AUX_PARAM, "num_graph_tokens"}


class Consumer:
    """The method that chooses between aux states and the residual, as DSpark runs it.

    layout "method": a method of its own, run whole (0.33.0: DFlashSpeculator._store_hidden_states,
    with aux staging for FULL graphs when it takes num_graph_tokens); "inline": the choice is a
    statement inside a larger method (0.32.0: DFlashSpeculator.propose), run as a slice.
    """

    def __init__(self, rel: str, cname: str, fn: ast.FunctionDef, passed: list[str]) -> None:
        self.rel, self.cname, self.fn, self.passed = rel, cname, fn, passed
        self.name = fn.name
        self.choice = choice_of(fn)
        args = fn.args
        required = [a.arg for a in [*args.posonlyargs, *args.args][: len(args.posonlyargs) + len(args.args) - len(args.defaults)]]
        required += [a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is None]
        self.layout = "method" if set(required) <= BENCH_PARAMS else "inline"
        self.staging = self.layout == "method" and "num_graph_tokens" in params_of(fn)

    def describe(self) -> str:
        via = "".join(f"{p} -> " for p in self.passed)
        return f"{via}{self.cname}.{self.name} ({self.rel}:{self.fn.lineno})"


def find_consumer(mro) -> Consumer:
    defs = mro_definitions(mro)
    choosers = [d for d in defs if RESIDUAL_PARAM in params_of(d[2]) and choice_of(d[2]) is not None]
    if not choosers:
        raise Missing(f"no method of {CONSUMER_CLASS} or its bases chooses between {AUX_PARAM} and {RESIDUAL_PARAM}")
    name = choosers[0][2].name
    passed: list[str] = []
    for rel, cname, fn in [d for d in defs if d[2].name == name]:
        if choice_of(fn) is None and passes_to_super(fn):
            passed.append(f"{cname}.{name} (passes through)")
            continue
        return Consumer(rel, cname, fn, passed)
    raise Missing(f"every {name} on {CONSUMER_CLASS}'s bases only passes {RESIDUAL_PARAM} on")


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
            imported = import_map(tree, rel).get(name)
            target = sources.module_file(imported[0]) if imported else None
            if not target or not imported:
                raise Missing(f"class {name} is not defined or imported in {rel}")
            walk(target, imported[1], depth + 1)
            return
        if any(r == rel and c.name == name for r, c in out):
            return
        out.append((rel, cls))
        imports = import_map(tree, rel)
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
    nodes, parents = walk_with_parents(tree)
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

    for node in nodes:
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


def _python_files(site: Path, top: str) -> list[str]:
    """What `sorted((site / top).rglob("*.py"))` less `__pycache__` gives, as paths relative to
    `site`, listed by os.walk: every entry named *.py (a folder or a link too, as rglob has it),
    no descent into a linked folder, sorted part by part as paths sort. pathlib's rglob is
    Python per entry; this is the C scandir (the census lists some 3,000 modules)."""
    found: list[list[str]] = []
    for folder, dirs, files in os.walk(os.path.join(site, top)):
        parts = os.path.relpath(folder, site).split(os.sep)
        if "__pycache__" in parts or "__pycache__" in site.parts:
            continue
        found.extend([*parts, name] for name in (*dirs, *files) if fnmatch.fnmatchcase(name, "*.py"))
        dirs[:] = [d for d in dirs if d != "__pycache__"]  # nothing below one is taken
    return ["/".join(parts) for parts in sorted(found) if "__pycache__" not in parts]


class Scan:
    """The census's walk over the tree, before any reach verdict: every reference found, the files
    that do not parse, and the files naming the patched decision function (what `reach` needs).
    It reads the tree and nothing else, so it can run in a process of its own (probe.py --census)
    and travel as JSON (`as_json` / `from_json`); the verdict is the same either way."""

    def __init__(self, refs: list[Ref], problems: list[str], skipping: set[str]) -> None:
        self.refs, self.problems, self.skipping = refs, problems, skipping

    def as_json(self) -> dict[str, object]:
        return {"refs": [[r.rel, r.line, r.function, r.cls, r.symbol, r.kind, r.none_safe, r.why] for r in self.refs],
                "problems": self.problems, "skipping": sorted(self.skipping)}

    @classmethod
    def from_json(cls, doc: object) -> Scan:
        """The scan `as_json` wrote; ValueError for anything else."""
        if not isinstance(doc, dict) or set(doc) != {"refs", "problems", "skipping"}:
            raise ValueError("not a census scan")
        refs = []
        for row in doc["refs"]:
            if not (isinstance(row, list) and len(row) == 8 and isinstance(row[1], int) and isinstance(row[6], bool)
                    and all(isinstance(row[i], str) for i in (0, 2, 4, 5, 7)) and isinstance(row[3], (str, type(None)))):
                raise ValueError("a malformed census reference")
            refs.append(Ref(*row))
        if not all(isinstance(p, str) for p in doc["problems"]) or not all(isinstance(f, str) for f in doc["skipping"]):
            raise ValueError("malformed census problems or files")
        return cls(refs, list(doc["problems"]), set(doc["skipping"]))


def run_census(sources: Sources, mro_classes: set[tuple[str, str]], scan: Scan | None = None) -> tuple[list[Ref], list[str]]:
    """Every reference with its reach verdict; `scan`: the walk, made already (else walked now)."""
    scan = scan if scan is not None else scan_tree(sources)
    for ref in scan.refs:
        ref.reached, ref.reach_why = reach(ref, skipping_files=scan.skipping, mro_classes=mro_classes)
    return scan.refs, scan.problems


def scan_tree(sources: Sources) -> Scan:
    refs: list[Ref] = []
    problems: list[str] = []
    needles = [s.encode() for s in CENSUS_SYMBOLS]
    skipping: set[str] = set()
    for rel in _python_files(sources.site, "vllm"):
        with open(os.path.join(sources.site, rel), "rb") as fh:
            data = fh.read()
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
    return Scan(refs, problems, skipping)


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
