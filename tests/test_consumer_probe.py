"""The consumer CPU probe, run as the image pipeline runs it: a separate interpreter over real trees.

Trees are real vLLM 0.33.0 installs (hard-linked from the cache), patched by our engine; the
deliberately broken variants change one real file through `replace_file`.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dspark_patch.patching.diff import parse_diff
from dspark_patch.patching.plan import plan_patch
from dspark_patch.patchset import load_dir
from dspark_patch.probe.run import bundle
from dspark_patch.targets.fs import read_inside, write_plan
from tests.support import probe_forks, vllm

REPO = Path(__file__).resolve().parents[1]
PROBE = REPO / "patches" / "dspark-skip-mtp-buffer" / "probe.py"
PATCH_DIR = REPO / "patches" / "dspark-skip-mtp-buffer"
MODEL = "vllm/models/deepseek_v4/nvidia/model.py"
DFLASH = "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"
DSPARK = "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py"
UTILS = "vllm/v1/worker/gpu/spec_decode/utils.py"

MODULES = load_dir(PATCH_DIR).probe_modules
COMMON = PATCH_DIR / "probe_common.py"


def _probe_constants() -> dict:
    # The case names, read from the probe's own source (it never imports vLLM; loading it is safe).
    namespace: dict = {"__name__": "consumer_probe_constants"}
    exec(compile(COMMON.read_text(), str(COMMON), "exec"), namespace)
    return namespace


P = _probe_constants()
CASES = [
    P["C_FLAG"], P["C_METHODS"], P["C_IMPORTS"], P["C_RESOLVER"],
    P["C_FLAG_OFF"], P["C_SKIP"], P["C_DFLASH"], P["C_OTHER"], P["C_V1"], P["C_PP"],
    P["C_BOUNDS"], P["C_MALFORMED"], P["C_PREFERRED"], P["C_INVALID"], P["C_ALLOC"], P["C_EFFECT"],
    P["C_RESOLUTION"], *P["C_BRANCH"].values(), P["C_NEGATIVE"], P["C_REPLAY"], P["C_CAPTURE"],
    P["C_PASSES"], P["C_DRAFTER"], P["C_FORWARD"], P["C_RUNNER"], P["C_CENSUS"], P["C_NO_VLLM"],
]
# What an unpatched 0.33.0 tree fails: everything the patch adds; the consumer facts and the
# census hold anyway (nothing reads the buffer unguarded on unpatched sources either).
FAILS_UNPATCHED = {
    P["C_FLAG"], P["C_IMPORTS"], P["C_RESOLVER"], P["C_FLAG_OFF"], P["C_SKIP"], P["C_DFLASH"],
    P["C_OTHER"], P["C_V1"], P["C_PP"], P["C_BOUNDS"], P["C_MALFORMED"], P["C_PREFERRED"],
    P["C_INVALID"], P["C_ALLOC"], P["C_EFFECT"],
}


def apply_patch_set(tree: Path) -> Path:
    variant = load_dir(PATCH_DIR).variant_for("0.33.0")
    write_plan(tree, plan_patch(parse_diff(variant.diff, strip=1), lambda rel: read_inside(tree, rel)))
    return tree


def probe(*args: str, python: list[str] | None = None, env: dict | None = None, cwd: Path | None = None,
          forks: probe_forks.Forks | None = None):
    """The probe's own script in a fresh interpreter (or `python` CMD); with `forks`, the source
    the tool runs (the bundle) in a fork of one interpreter that imported torch once."""
    if forks is not None:
        assert python is None and cwd is None
        done = forks.run_python(bundle(PROBE, MODULES), args, env={"CUDA_VISIBLE_DEVICES": "", **(env or {})})
        return subprocess.CompletedProcess(args, done.returncode, done.stdout.decode(), done.stderr.decode())
    run = subprocess.run(
        [*(python or [sys.executable, "-B", str(PROBE)]), *args],
        capture_output=True, text=True, cwd=cwd,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})},
    )
    return run


def cases_of(run) -> dict[str, dict]:
    doc = json.loads(run.stdout)
    assert doc["schema"] == "dspark-patch/probe/v1"
    assert set(doc) == {"schema", "ok", "cases", "census", "where"}
    assert doc["ok"] is all(c["ok"] for c in doc["cases"])
    for case in doc["cases"]:
        assert set(case) == {"name", "ok", "detail"} and isinstance(case["detail"], str) and case["detail"]
    return {c["name"]: c for c in doc["cases"]}


def edit(tree: Path, rel: str, old: str, new: str) -> None:
    path = tree / rel
    source = path.read_text()
    assert source.count(old) == 1, f"{old!r} not found once in {rel}"
    vllm.replace_file(path, source.replace(old, new).encode())


@pytest.fixture(scope="module")
def forks() -> Iterator[probe_forks.Forks]:
    runs = probe_forks.Forks()
    yield runs
    runs.close()


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> Path:
    return apply_patch_set(vllm.tree_copy("0.33.0", tmp_path_factory.mktemp("probe033") / "site-packages"))


def test_probe_passes_on_the_patched_tree(patched, forks):
    run = probe("--site", str(patched), "--json", forks=forks)
    assert run.returncode == 0, run.stdout + run.stderr
    cases = cases_of(run)
    assert list(cases) == CASES
    assert all(c["ok"] for c in cases.values())
    assert "128.00 MiB" in cases[P["C_ALLOC"]]["detail"]
    assert "DFlashSpeculator" in cases[P["C_RESOLUTION"]]["detail"]
    census = json.loads(run.stdout)["census"]
    assert census and all(
        set(e) == {"file", "line", "function", "symbol", "kind", "reached", "none_safe", "verdict"} for e in census
    )
    assert all(e["none_safe"] for e in census if e["reached"])


def test_probe_run_from_its_source_writes_nothing(patched, tmp_path):
    # The image pipeline passes the source with -c: no __file__, no bytecode, no temp files.
    before = sorted(p for p in patched.rglob("*") if p.is_file() and "__pycache__" in p.parts)
    run = probe("--site", str(patched), python=[sys.executable, "-B", "-c", bundle(PROBE, MODULES)],
                cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert list(cases_of(run)) == CASES
    after = sorted(p for p in patched.rglob("*") if p.is_file() and "__pycache__" in p.parts)
    assert before == after
    assert list(tmp_path.iterdir()) == []


def test_the_census_walked_apart_gives_the_very_verdict_and_a_walk_it_cannot_use_is_redone(
        patched, vllm033_tree, tmp_path, forks):
    # patch.toml's probe_beside: where the probe starts early, a child walks the tree with
    # --census beside torch's import and the probe takes that walk with --census-from.
    assert load_dir(PATCH_DIR).probe_beside == "--census"
    no_torch = "import sys\nsys.modules['torch'] = None  # any import of torch fails\n" + bundle(PROBE, MODULES)
    for tree, code in ((patched, 0), (vllm033_tree, 1)):
        whole = probe("--site", str(tree), "--json", forks=forks)
        assert whole.returncode == code, whole.stderr
        walk = probe("--site", str(tree), "--census", python=[sys.executable, "-B", "-c", no_torch])
        assert walk.returncode == 0, walk.stderr  # the walk needs no torch
        doc = json.loads(walk.stdout)
        assert doc["site"] == str(tree) and doc["refs"] and set(doc) == {"schema", "site", "refs", "problems", "skipping"}
        good = tmp_path / "walk.json"
        good.write_text(walk.stdout)
        split = probe("--site", str(tree), "--json", "--census-from", str(good), forks=forks)
        assert (split.returncode, split.stdout) == (whole.returncode, whole.stdout)
        # cut short (a child that died), or of another tree: the probe walks itself, same verdict
        short = tmp_path / "short.json"
        short.write_text(walk.stdout[: len(walk.stdout) // 2])
        other = tmp_path / "other.json"
        other.write_text(walk.stdout.replace(json.dumps(str(tree)), json.dumps(str(tmp_path)), 1))
        for unusable in (short, other, tmp_path / "absent.json"):
            again = probe("--site", str(tree), "--json", "--census-from", str(unusable), forks=forks)
            assert (again.returncode, again.stdout) == (whole.returncode, whole.stdout), unusable
    # and the walk is the census: one unguarded reader in it fails the census case
    walk = json.loads(probe("--site", str(patched), "--census", forks=forks).stdout)
    ref = next(r for r in walk["refs"] if r[0] == MODEL and r[5] == "read")
    ref[6] = False
    good.write_text(json.dumps(walk))
    forged = cases_of(probe("--site", str(patched), "--json", "--census-from", str(good), forks=forks))
    assert not forged[P["C_CENSUS"]]["ok"] and f"{MODEL}:{ref[1]}" in forged[P["C_CENSUS"]]["detail"]


def test_probe_source_is_standalone_and_small():
    # One source travels as one argument: well under the kernel's 128 KiB limit on it.
    assert len(bundle(PROBE, MODULES).encode()) < 100_000
    own = {m.stem for m in MODULES}
    assert {"probe_census", "probe_decision", "probe_allocation", "probe_consumers", "probe_runner"} <= own
    for path in (PROBE, *MODULES):
        tree = ast.parse(path.read_text())
        names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        assert "__file__" not in names, path.name
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert imported <= set(sys.stdlib_module_names) | {"torch", "__future__"} | own, path.name


def test_probe_fails_on_an_unpatched_tree_but_the_consumer_cases_pass(vllm033_tree, forks):
    run = probe("--site", str(vllm033_tree), forks=forks)
    assert run.returncode == 1, run.stderr
    cases = cases_of(run)
    assert {n for n, c in cases.items() if not c["ok"]} == FAILS_UNPATCHED
    assert "patch is not applied" in cases[P["C_IMPORTS"]]["detail"]


def test_negative_control_fails_when_the_fallback_no_longer_reads_the_residual(vllm033_tree, forks):
    apply_patch_set(vllm033_tree)
    edit(vllm033_tree, DFLASH, "            hidden_states = last_hidden_states[start:num_tokens]\n",
         "            hidden_states = torch.zeros_like(self.hidden_states[start:num_tokens])\n")
    run = probe("--site", str(vllm033_tree), forks=forks)
    assert run.returncode == 1
    cases = cases_of(run)
    assert [n for n, c in cases.items() if not c["ok"]] == [P["C_NEGATIVE"]]
    assert "did not read the residual" in cases[P["C_NEGATIVE"]]["detail"]


def test_probe_never_imports_vllm_even_when_it_is_importable(patched):
    run = probe("--site", str(patched), env={"PYTHONPATH": str(patched)})
    assert run.returncode == 0, run.stdout + run.stderr
    assert cases_of(run)[P["C_NO_VLLM"]]["ok"]


def test_missing_site_is_bad_usage(tmp_path):
    run = probe("--site", str(tmp_path / "nowhere"))
    assert run.returncode == 2 and run.stdout == ""
    assert "no vllm package" in run.stderr
    assert probe().returncode == 2  # --site is required


def test_interpreter_without_torch_is_an_environment_problem(patched):
    # -S leaves the venv's site-packages (and so torch) off sys.path.
    run = probe("--site", str(patched), python=[sys.executable, "-S", "-B", str(PROBE)])
    assert run.returncode == 3 and "torch is not importable" in run.stderr


def test_census_reads_the_modules_rglob_finds(tmp_path):
    # The census lists the tree with os.walk (pathlib's rglob is Python per entry: seconds under
    # emulation); which modules it reads decides its verdict, so the two must agree, odd entries
    # included: a folder named *.py, links to files and folders (never followed into), a dangling
    # link, a hidden `.py`, bytecode folders (skipped), names that only look alike.
    site = tmp_path / "site"
    vllm_dir = site / "vllm"
    for folder in ("a/__pycache__/deep", "dir.py/inner", "b"):
        (vllm_dir / folder).mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    for name in ("a/x.py", "a/__pycache__/y.py", "a/__pycache__/deep/z.py", "dir.py/inner/q.py", "b/.py",
                 "b/c.PY", "b/d.py", "b/e.pyc", "b/sp ace.py", "a-b.py", "a.py"):
        (vllm_dir / name).write_text("")
    (tmp_path / "outside" / "out.py").write_text("")
    (vllm_dir / "b" / "linkdir").symlink_to(tmp_path / "outside")
    (vllm_dir / "linkdir.py").symlink_to(tmp_path / "outside")
    (vllm_dir / "b" / "link.py").symlink_to(vllm_dir / "a.py")
    (vllm_dir / "b" / "broken.py").symlink_to(tmp_path / "nowhere")
    check = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); import probe_census; "
             "site = Path(sys.argv[2]); "
             "want = [p.relative_to(site).as_posix() for p in sorted((site / 'vllm').rglob('*.py')) "
             "if '__pycache__' not in p.parts]; "
             "print(want == probe_census._python_files(site, 'vllm'), want)")
    done = subprocess.run([sys.executable, "-B", "-c", check, str(PATCH_DIR), str(site)],
                          capture_output=True, text=True, check=True)
    agree, _, listed = done.stdout.partition(" ")
    assert agree == "True", done.stdout
    assert "vllm/dir.py" in listed and "vllm/b/broken.py" in listed and "out.py" not in listed and "y.py" not in listed
