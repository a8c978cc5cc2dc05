"""The code keeps to the layout docs/design.md draws (fast tier): every import between units is
one its table allows (function-level and TYPE_CHECKING imports included), and no two modules
import each other, directly or round a longer loop."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "dspark_patch"
DESIGN = ROOT / "docs" / "design.md"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _imports(module: str, path: Path) -> set[str]:
    """The modules of ours `module` imports anywhere in its body, resolved to real modules."""
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                prefix = ".".join([*base, *([node.module] if node.module else [])])
            else:
                prefix = node.module or ""
            names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in MODULES else prefix for a in node.names]
        for name in names:
            if name != "dspark_patch" and not name.startswith("dspark_patch."):
                continue
            while name not in MODULES and "." in name:
                name = name.rsplit(".", 1)[0]
            out.add(name)
    return out


def unit(module: str) -> str:
    parts = module.split(".")[1:]
    if not parts:
        return "dspark_patch"
    if parts[:2] == ["targets", "docker"]:
        return "targets.docker"
    return parts[0]


def allowed_table(text: str) -> dict[str, set[str]]:
    section = text.split("## Who may import whom", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0].startswith("`"):
            table[cells[0].strip("`")] = set(re.findall(r"`([^`]+)`", cells[1]))
    return table


GRAPH = {m: _imports(m, p) for m, p in MODULES.items()}


def test_the_design_table_names_every_unit_and_only_real_ones() -> None:
    table = allowed_table(DESIGN.read_text(encoding="utf-8"))
    units = {unit(m) for m in MODULES} - {"dspark_patch"}
    assert set(table) == units
    assert set().union(*table.values()) <= units | {"dspark_patch"}


def test_every_import_between_units_is_one_the_design_table_allows() -> None:
    table = allowed_table(DESIGN.read_text(encoding="utf-8"))
    against = sorted(f"{m} imports {t} ({unit(m)} -> {unit(t)})"
                     for m, targets in GRAPH.items() for t in targets
                     if unit(m) != unit(t) and unit(m) != "dspark_patch" and unit(t) not in table[unit(m)])
    assert against == []


def test_no_import_cycle_between_modules() -> None:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(GRAPH[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(GRAPH):
        if module not in index:
            visit(module)
    assert cycles == []


def test_the_checker_sees_function_level_relative_and_type_checking_imports() -> None:
    # What the checks above rest on: the lazy factory import, a TYPE_CHECKING one, a parent-relative one.
    assert "dspark_patch.targets.docker.store" in GRAPH["dspark_patch.targets"]
    assert "dspark_patch.targets.base" in GRAPH["dspark_patch.status.fleet"]
    assert "dspark_patch.imageref" in GRAPH["dspark_patch.targets.docker.transfer"]
    assert not any(unit(t) == "targets.docker" for m in GRAPH if unit(m) == "pipeline" for t in GRAPH[m])


def test_pipeline_and_status_reach_images_only_through_the_store() -> None:
    for module, path in MODULES.items():
        if unit(module) in ("pipeline", "status"):
            text = path.read_text(encoding="utf-8")
            assert ".attrs" not in text and "targets.docker" not in text, module


def test_the_table_reader_reads_rows_and_empty_cells() -> None:
    table = allowed_table("## Who may import whom\n| unit | may import |\n|---|---|\n| `a` | `b`, `c` |\n| `b` | |\n")
    assert table == {"a": {"b", "c"}, "b": set()}


# Scripts that run on their own have their own stdout: inside/ runs in the target (its JSON on
# stdout is its answer) and references/build.py is the maintainers' command that makes the data.
OWN_STDOUT = ("dspark_patch.inside", "dspark_patch.references.build")


def _prints(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        what = ast.unparse(f)
        if (isinstance(f, ast.Name) and f.id in ("print", "Console")) or what in (
                "typer.echo", "typer.secho", "sys.stdout.write", "sys.stderr.write", "click.echo") or (
                isinstance(f, ast.Attribute) and f.attr == "print"):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} {what}(...)")
    return found


def test_only_cli_output_prints() -> None:
    printing = [hit for module, path in sorted(MODULES.items())
                if module != "dspark_patch.cli.output" and not module.startswith(OWN_STDOUT)
                for hit in _prints(path)]
    assert printing == []
    assert _prints(MODULES["dspark_patch.cli.output"])  # the checker sees print calls where they are


_CLOCKS = ("monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns")


def _timed_asserts(source: str) -> list[int]:
    """Lines of asserts that compare a span of a clock (`clock() - start`) with a bound."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Assert):
            continue
        for sub in ast.walk(node.test):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Sub) and any(
                    isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in _CLOCKS
                    for c in ast.walk(sub)):
                found.append(node.lineno)
                break
    return found


def test_no_test_asserts_a_duration() -> None:
    """Speed goes into bench/, measured side by side; a test's bound on seconds fails on a
    loaded machine and passes on a fast one whatever the code does."""
    timed = [f"{p.relative_to(ROOT)}:{line}" for p in sorted((ROOT / "tests").rglob("test_*.py"))
             for line in _timed_asserts(p.read_text(encoding="utf-8"))]
    assert timed == []
    assert _timed_asserts("import time\nstart = time.monotonic()\nassert time.monotonic() - start < 30\n") == [3]


# A tracker number says nothing to a reader without the tracker: code, tests and docs name the
# rule (docs/status.md's classes have names). The pattern is built so this file does not match it.
TRACKER_CITATION = re.compile(r"\b" + "issue" + r"s? \d|\b" + "class" + r"(?:es)? \d")


def test_code_tests_and_docs_name_rules_not_tracker_numbers() -> None:
    found = [f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}"
             for folder in ("dspark_patch", "tests", "docs", "bench")
             for path in sorted((ROOT / folder).rglob("*")) if path.suffix in (".py", ".md", ".toml")
             for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
             if TRACKER_CITATION.search(line)]
    assert found == []
    assert TRACKER_CITATION.search("as " + "issue" + " 16 says") and not TRACKER_CITATION.search("tiss" + "ue 4")
    assert TRACKER_CITATION.search("(" + "class" + " 3)") and not TRACKER_CITATION.search("subclass" + " 3")


# targets/ has two folders of read-only parts (docs/design.md, layout): the views status reads and
# the caches. Neither may reach the code that writes (a target, the engine's containers), and a
# cache never depends on a view: what a view or a cache does can then never change an image or a tree.
_WRITERS = ("dspark_patch.targets.docker", "dspark_patch.targets.local_tree", "dspark_patch.targets.fs",
            "dspark_patch.targets.journal", "dspark_patch.targets.recovery")


def test_views_and_caches_never_import_what_writes() -> None:
    views = {m for m in MODULES if m.startswith("dspark_patch.targets.views")}
    caches = {m for m in MODULES if m.startswith("dspark_patch.targets.caches")}
    assert len(views) > 1 and len(caches) > 1  # the folders exist and hold modules
    wrong = [(m, d) for m in views | caches for d in GRAPH[m]
             if d.startswith(_WRITERS) or (m in caches and d in views)]
    assert wrong == []


def test_no_module_of_the_pipeline_or_the_targets_outgrows_400_lines() -> None:
    """The house's rule (docs/design.md): small modules; a file that grows past it is split."""
    long = {m: n for m, p in MODULES.items() if m.split(".")[1:2] in (["pipeline"], ["targets"])
            and (n := len(p.read_text(encoding="utf-8").splitlines())) > 400}
    assert long == {}


def test_applys_core_stays_a_short_list_of_steps() -> None:
    """`_patch` (plan, base check, the outcome decided once, its steps) stays under 60 lines."""
    tree = ast.parse(MODULES["dspark_patch.pipeline.commands"].read_text(encoding="utf-8"))
    core = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_patch")
    assert core.end_lineno is not None and core.end_lineno - core.lineno + 1 < 60
