"""The dspark-skip-mtp-buffer patch set against the real vLLM 0.33.0 sources, patched by our engine.

vLLM cannot be imported here (no GPU libraries), so the patched functions are pulled out of the
patched files by AST and run with synthetic configs, the way the consumer probe does it in an
image. Every helper below reads the real installed files; nothing is re-typed from vLLM: the
speculative config the decision asks is the release's own `SpeculativeConfig`, its methods taken
from the installed `vllm/config/speculative.py` as the probe takes them.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import py_compile
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dspark_patch.errors import UnsupportedRelease
from dspark_patch.patching.diff import parse_diff
from dspark_patch.patching.plan import plan_patch
from dspark_patch.patchset import load_dir
from dspark_patch.targets.fs import read_inside, write_plan
from tests.support import vllm

REPO = Path(__file__).resolve().parents[1]
PATCH_DIR = REPO / "patches" / "dspark-skip-mtp-buffer"
PROBE = REPO / "patches" / "dspark-skip-mtp-buffer" / "probe.py"
FLAG = "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER"
MODEL = "vllm/models/deepseek_v4/nvidia/model.py"
ENVS = "vllm/envs.py"
EAGLE3_UTILS = "vllm/v1/worker/gpu/spec_decode/eagle/eagle3_utils.py"
DFLASH = "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"
PLATFORM = "vllm/platforms/interface.py"
SPECULATIVE = "vllm/config/speculative.py"
NUM_LAYERS = 43  # DeepSeek V4 Flash target layers


def apply_patch_set(tree: Path):
    variant = load_dir(PATCH_DIR).variant_for("0.33.0")
    plan = plan_patch(parse_diff(variant.diff, strip=1), lambda rel: read_inside(tree, rel))
    write_plan(tree, plan)
    return plan


@pytest.fixture(scope="module")
def patched(tmp_path_factory) -> Path:
    """One real 0.33.0 tree patched by our engine, shared by the read-only tests of this module."""
    tree = vllm.tree_copy("0.33.0", tmp_path_factory.mktemp("dspark033") / "site-packages")
    apply_patch_set(tree)
    return tree


# --- pulling real functions out of the patched files ----------------------------------------
def _parse(tree: Path, rel: str) -> ast.Module:
    return ast.parse((tree / rel).read_bytes())


def _function(module: ast.Module, name: str) -> ast.FunctionDef:
    for node in module.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise LookupError(name)


def _bare(fn: ast.FunctionDef) -> ast.FunctionDef:
    """The function without annotations/decorators (they name vLLM types we cannot import)."""
    fn = ast.parse(ast.unparse(fn)).body[0]
    fn.decorator_list, fn.returns = [], None
    for arg in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]:
        arg.annotation = None
    return fn


def _define(fn: ast.FunctionDef, namespace: dict) -> object:
    exec(compile(ast.fix_missing_locations(ast.Module([_bare(fn)], [])), fn.name, "exec"), namespace)
    return namespace[fn.name]


class Envs:
    """vllm.envs as its module __getattr__ behaves: entries of the real environment_variables table."""

    def __init__(self, tree: Path) -> None:
        module = _parse(tree, ENVS)
        ns: dict = {"os": os}
        _define(_function(module, "env_with_choices"), ns)
        table = next(
            n.value for n in module.body
            if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "environment_variables"
        )
        self.table = {k.value: v for k, v in zip(table.keys, table.values)}
        self._ns = ns

    def __getattr__(self, name: str):
        if name not in self.table:
            raise AttributeError(f"module 'vllm.envs' has no attribute {name!r}")
        return eval(compile(ast.Expression(self.table[name]), name, "eval"), self._ns)()


def decision(tree: Path):
    ns: dict = {"envs": Envs(tree)}
    _define(_function(_parse(tree, EAGLE3_UTILS), "get_eagle3_aux_layers_from_config"), ns)
    return _define(_function(_parse(tree, MODEL), "dspark_skips_mtp_hidden_buffer"), ns)


def speculative_config_class(tree: Path) -> type:
    """vLLM's `SpeculativeConfig` of `tree`, as the probe takes it: the class's own methods (the
    undecorated ones, from the installed file) on an object holding the fields a test gives.

    The class itself cannot be made here: `vllm.config` imports vLLM's dependencies (regex,
    transformers, ...), none of them installed, and its `__post_init__` builds the draft model's
    `ModelConfig`, which loads that model's config from the hub."""
    cls = next(n for n in _parse(tree, SPECULATIVE).body if isinstance(n, ast.ClassDef) and n.name == "SpeculativeConfig")
    ns: dict = {}
    methods = {fn.name: _define(fn, ns) for fn in cls.body
               if isinstance(fn, ast.FunctionDef) and not fn.decorator_list and not fn.name.startswith("__")}
    return type("SpeculativeConfig", (SimpleNamespace,), methods)


def declared_methods(tree: Path) -> set[str]:
    """Every speculative method the release declares: the strings of its `SpeculativeMethod`
    Literal, following the Literal aliases it names."""
    literals = {n.targets[0].id: n.value for n in _parse(tree, SPECULATIVE).body
                if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Subscript)
                and ast.unparse(n.value.value) == "Literal"}

    def strings(name: str) -> set[str]:
        items = literals[name].slice
        found: set[str] = set()
        for item in items.elts if isinstance(items, ast.Tuple) else [items]:
            if isinstance(item, ast.Constant):
                found.add(item.value)
            elif isinstance(item, ast.Name):
                found |= strings(item.id)
            else:
                raise LookupError(f"{name}: {ast.unparse(item)} is neither a string nor a Literal's name")
        return found

    return strings("SpeculativeMethod")


def config(speculative_config: type, *, method="dspark", v2=True, pp=1, aux=(1, 21, 41),
           aux_key="dspark_target_layer_ids", rows=4096, dtype=torch.bfloat16):
    spec = None
    if method is not None:
        hf = SimpleNamespace(model_type="deepseek_v4")
        if aux is not None:
            setattr(hf, aux_key, list(aux))
        spec = speculative_config(method=method, draft_model_config=SimpleNamespace(hf_config=hf))
    return SimpleNamespace(
        speculative_config=spec, use_v2_model_runner=v2,
        parallel_config=SimpleNamespace(pipeline_parallel_size=pp),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=rows),
        model_config=SimpleNamespace(dtype=dtype),
    )


@pytest.fixture(scope="module")
def skips(patched):
    """The patched decision on a config of `config(...)`'s keywords, with the tree's own
    SpeculativeConfig, for DeepSeek V4 Flash's layers."""
    decide, speculative_config = decision(patched), speculative_config_class(patched)
    return lambda **cfg: decide(config(speculative_config, **cfg), NUM_LAYERS)


# --- the diff itself --------------------------------------------------------------------------
def test_applies_to_real_033_with_zero_fuzz_and_the_recorded_hashes(vllm033_tree):
    variant = load_dir(PATCH_DIR).variant_for("0.33.0")
    plan = apply_patch_set(vllm033_tree)
    assert plan.status == "apply"
    assert {f.path for f in plan.files} == set(variant.files) == {ENVS, MODEL}
    for f in plan.files:
        assert all(p.fuzz == 0 and p.offset == 0 for p in f.placements), f.path
        assert (f.pre_sha256, f.post_sha256) == (variant.files[f.path].pre_sha256, variant.files[f.path].post_sha256)
        assert hashlib.sha256((vllm033_tree / f.path).read_bytes()).hexdigest() == f.post_sha256
    # The cached install (hard-linked into the tree) is untouched: the engine replaced the files.
    cached = vllm.installed_tree("0.33.0")
    assert hashlib.sha256((cached / MODEL).read_bytes()).hexdigest() == variant.files[MODEL].pre_sha256


def test_second_apply_finds_it_already_applied(patched):
    variant = load_dir(PATCH_DIR).variant_for("0.33.0")
    plan = plan_patch(parse_diff(variant.diff, strip=1), lambda rel: read_inside(patched, rel))
    assert plan.status == "already-applied"


@pytest.mark.parametrize("release", ["0.30.0", "0.31.0", "0.33.1"])
def test_other_releases_are_refused(release):
    with pytest.raises(UnsupportedRelease, match=rf"no variant for vllm {release}.*0\.33\.0"):
        load_dir(PATCH_DIR).variant_for(release)


def test_patched_files_byte_compile_in_checked_hash_mode(patched, tmp_path):
    for rel in (ENVS, MODEL):
        out = tmp_path / (Path(rel).name + "c")
        py_compile.compile(
            str(patched / rel), cfile=str(out), doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )
        assert out.read_bytes()[4:8] == (3).to_bytes(4, "little")  # flags: hash-based, checked


# --- the decision -----------------------------------------------------------------------------
def test_opt_in_skips_for_v2_dspark_with_valid_aux_layers_and_pp1(skips, monkeypatch):
    monkeypatch.setenv(FLAG, "1")
    assert skips() is True


def test_default_unset_keeps_the_buffer(skips, monkeypatch):
    monkeypatch.delenv(FLAG, raising=False)
    assert skips() is False


def test_flag_zero_keeps_the_buffer(skips, monkeypatch):
    monkeypatch.setenv(FLAG, "0")
    assert skips() is False


@pytest.mark.parametrize("value", ["2", "true", "yes", "", " 1", "01"])
@pytest.mark.parametrize("method", ["dspark", "mtp", None])
def test_invalid_values_are_an_error_naming_the_variable_and_choices(skips, monkeypatch, value, method):
    monkeypatch.setenv(FLAG, value)
    with pytest.raises(ValueError) as info:
        skips(method=method)
    assert FLAG in str(info.value) and "'0'" in str(info.value) and "'1'" in str(info.value)


def test_ordinary_mtp_keeps_the_buffer(skips, monkeypatch):
    monkeypatch.setenv(FLAG, "1")
    assert skips(method="mtp") is False


@pytest.mark.parametrize("method", ["eagle", "eagle3", "dflash", "draft_model", "ngram", None])
def test_other_methods_keep_the_buffer(skips, monkeypatch, method):
    monkeypatch.setenv(FLAG, "1")
    assert skips(method=method) is False


def test_of_every_method_the_release_declares_only_dspark_skips(patched, skips, monkeypatch):
    monkeypatch.setenv(FLAG, "1")
    methods = declared_methods(patched)
    assert {"dspark", "dflash", "eagle3", "mtp", "draft_model", "ngram"} < methods  # the Literal was read
    assert {method for method in methods if skips(method=method)} == {"dspark"}


def test_v1_model_runner_keeps_the_buffer(skips, monkeypatch):
    monkeypatch.setenv(FLAG, "1")
    assert skips(v2=False) is False


@pytest.mark.parametrize("pp", [2, 4])
def test_pipeline_parallel_keeps_the_buffer(skips, monkeypatch, pp):
    monkeypatch.setenv(FLAG, "1")
    assert skips(pp=pp) is False


def test_missing_aux_layers_keep_the_buffer(skips, monkeypatch):
    # No ids in the draft config: 0.33.0 falls back to the model's default layers.
    monkeypatch.setenv(FLAG, "1")
    assert skips(aux=None) is False


@pytest.mark.parametrize(
    "aux",
    [
        pytest.param([], id="empty"),
        pytest.param([1, 1, 41], id="duplicate"),
        pytest.param([1, NUM_LAYERS], id="past-last-layer"),
        pytest.param([-1, 5], id="before-first-layer"),
        pytest.param([1.0, 5.0], id="not-int"),
    ],
)
def test_invalid_aux_layers_keep_the_buffer(skips, monkeypatch, aux):
    monkeypatch.setenv(FLAG, "1")
    assert skips(aux=aux) is False


def test_aux_layers_are_read_where_033_reads_them(skips, monkeypatch):
    # eagle_aux_hidden_state_layer_ids are taken as-is (capture-after); dspark ids get +1.
    monkeypatch.setenv(FLAG, "1")
    assert skips(aux=[2, 43], aux_key="eagle_aux_hidden_state_layer_ids") is True
    assert skips(aux=[2, 44], aux_key="eagle_aux_hidden_state_layer_ids") is False
    assert skips(aux=[True, 5], aux_key="eagle_aux_hidden_state_layer_ids") is False
    assert skips(aux=[42]) is True  # the last layer, 43 after +1


# --- the allocation site in DeepseekV4Model.__init__ ----------------------------------------
class Logger:
    def __init__(self):
        self.lines = []

    def info(self, msg, *args):
        self.lines.append(("INFO", msg % args))

    def warning(self, msg, *args):
        self.lines.append(("WARNING", msg % args))


def allocation_site(tree: Path):
    """The statements of DeepseekV4Model.__init__ from `spec_config = ...` to the buffer's `if`."""
    cls = next(n for n in _parse(tree, MODEL).body if isinstance(n, ast.ClassDef) and n.name == "DeepseekV4Model")
    body = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__").body
    end = max(i for i, s in enumerate(body) if isinstance(s, ast.If) and "self._mtp_hidden_buffer =" in ast.unparse(s))
    start = max(i for i, s in enumerate(body[:end]) if ast.unparse(s).startswith("spec_config ="))
    return compile(ast.Module(body[start : end + 1], []), "DeepseekV4Model.__init__", "exec")


def run_site(tree, *, pp_last=True, **cfg):
    logger, owner = Logger(), SimpleNamespace(hc_dim=cfg.pop("hc_dim", 16384))
    ns = {
        "torch": torch, "logger": logger, "self": owner, "vllm_config": config(speculative_config_class(tree), **cfg),
        "config": SimpleNamespace(num_hidden_layers=NUM_LAYERS),
        "get_pp_group": lambda: SimpleNamespace(is_last_rank=pp_last),
        "dspark_skips_mtp_hidden_buffer": decision(tree),
    }
    exec(allocation_site(tree), ns)
    return owner._mtp_hidden_buffer, logger.lines


@pytest.mark.parametrize(
    ("rows", "hc_dim", "dtype", "mib"),
    [
        (4096, 4 * 4096, torch.bfloat16, "128.00"),  # the seed's geometry
        (8192, 4 * 7168, torch.float16, "448.00"),
        (1000, 4 * 4096, torch.float32, "62.50"),
    ],
)
def test_skip_logs_one_info_line_with_the_flag_and_mib_from_the_real_shape(patched, monkeypatch, rows, hc_dim, dtype, mib):
    monkeypatch.setenv(FLAG, "1")
    buffer, lines = run_site(patched, rows=rows, hc_dim=hc_dim, dtype=dtype)
    assert buffer is None
    assert lines == [(
        "INFO",
        f"{FLAG}=1: skipped _mtp_hidden_buffer ({rows} x {hc_dim}, {dtype}): {mib} MiB not allocated on this rank",
    )]


@pytest.mark.parametrize("flag", [None, "0", "1"])
def test_site_allocates_exactly_as_before_when_not_skipping(patched, monkeypatch, flag):
    if flag is None:
        monkeypatch.delenv(FLAG, raising=False)
    else:
        monkeypatch.setenv(FLAG, flag)
    method = "mtp" if flag == "1" else "dspark"
    buffer, lines = run_site(patched, method=method, rows=8, hc_dim=16, dtype=torch.float16)
    assert isinstance(buffer, torch.Tensor) and buffer.shape == (8, 16) and buffer.dtype == torch.float16
    assert lines == []


def test_site_keeps_no_buffer_on_a_non_last_pp_rank(patched, monkeypatch):
    monkeypatch.setenv(FLAG, "1")
    buffer, lines = run_site(patched, pp=2, pp_last=False, rows=8, hc_dim=16)
    assert buffer is None and lines == []


# --- envs registration --------------------------------------------------------------------------
def validate_environ(tree: Path, envs: Envs, logger: Logger):
    """Platform.validate_environ from the real file, its `from vllm import envs` replaced by ours."""
    cls = next(n for n in _parse(tree, PLATFORM).body if isinstance(n, ast.ClassDef) and n.name == "Platform")
    fn = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "validate_environ")
    fn = _bare(fn)
    fn.body = [s for s in fn.body if not isinstance(s, ast.ImportFrom)]
    return _define(fn, {"os": os, "envs": SimpleNamespace(environment_variables=envs.table), "logger": logger})


@pytest.mark.parametrize("hard_fail", [True, False])
def test_flag_is_registered_so_environ_validation_stays_quiet(patched, monkeypatch, hard_fail):
    monkeypatch.setenv(FLAG, "1")
    logger = Logger()
    validate_environ(patched, Envs(patched), logger)(None, hard_fail)
    assert logger.lines == []
    assert f"    {FLAG}: bool = False\n" in (patched / ENVS).read_text()  # the TYPE_CHECKING declaration


def test_unpatched_envs_trips_fail_on_environ_validation(vllm033_tree, monkeypatch):
    # The control: without the registration, --fail-on-environ-validation refuses the flag.
    monkeypatch.setenv(FLAG, "1")
    with pytest.raises(ValueError, match=f"Unknown vLLM environment variable detected: {FLAG}"):
        validate_environ(vllm033_tree, Envs(vllm033_tree), Logger())(None, True)


def test_flag_parses_through_the_envs_table(patched, monkeypatch):
    envs = Envs(patched)
    monkeypatch.delenv(FLAG, raising=False)
    assert getattr(envs, FLAG) is False
    monkeypatch.setenv(FLAG, "1")
    assert getattr(envs, FLAG) is True
    monkeypatch.setenv(FLAG, "on")
    with pytest.raises(ValueError, match=f"Invalid value 'on' for {FLAG}. Valid options: \\['0', '1'\\]"):
        getattr(envs, FLAG)


def test_flag_stays_a_compile_cache_factor(patched):
    # It changes the traced forward (the buffer copy disappears), so torch.compile caches from
    # flag-off runs must not be reused with it on: it must not be in compile_factors' ignore list.
    fn = _function(_parse(patched, ENVS), "compile_factors")
    ignored = next(
        n.value for n in ast.walk(fn)
        if isinstance(n, ast.AnnAssign) and getattr(n.target, "id", "") == "ignored_factors"
    )
    names = {e.value for e in ignored.elts}
    assert "VLLM_REQUEST_BODY_LOG_LEVEL" in names and FLAG not in names


# --- the probe on a deliberately broken consumer -------------------------------------------------
def test_probe_fails_when_the_consumer_reads_the_residual(vllm033_tree):
    apply_patch_set(vllm033_tree)
    path = vllm033_tree / DFLASH
    source = path.read_text()
    anchor = "        start = 0\n        if num_graph_tokens and self._aux_staging is not None:\n"
    assert source.count(anchor) == 1
    broken = source.replace(anchor, "        _ = last_hidden_states[:num_tokens].sum()\n" + anchor)
    vllm.replace_file(path, broken.encode())
    run = subprocess.run(
        [sys.executable, "-B", str(PROBE), "--site", str(vllm033_tree)],
        capture_output=True, text=True, env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert run.returncode == 1, run.stderr
    cases = {c["name"]: c for c in json.loads(run.stdout)["cases"]}
    branches = [n for n in cases if n.startswith("consumer: ") and n.endswith("never reads the residual")]
    assert len(branches) == 3
    for name in branches:
        assert not cases[name]["ok"] and "residual" in cases[name]["detail"], cases[name]
    # The patch itself is fine; only the consumer broke.
    assert cases["decision: flag 1 skips for V2 DSpark, PP 1, valid layer ids"]["ok"]
