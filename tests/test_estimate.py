"""`estimate`: the omitted bytes of _mtp_hidden_buffer and the token refund they imply."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dspark_patch.cli.evaluate import register
from dspark_patch.errors import DsparkPatchError
from dspark_patch.evaluate.estimate import estimate_omission, read_model_config
from tests.support import vllm

runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def invoke(*args: str):
    """Run a command as the lead's main() does: a DsparkPatchError becomes its exit code."""
    result = runner.invoke(_app(), list(args))
    if isinstance(result.exception, DsparkPatchError):
        return result.exception.exit_code, result.stdout, result.exception.line()
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.stdout, ""


def test_seed_geometry_omits_exactly_128_mib():
    est = estimate_omission(tokens=4096, hidden=4096, hc_mult=4, dtype="bfloat16")
    assert est.bytes == 134_217_728
    assert est.mib == 128.0
    assert est.refund_tokens is None


def test_refund_is_bytes_floor_divided_by_kv_bytes_per_token():
    est = estimate_omission(tokens=4096, hidden=4096, hc_mult=4, dtype="bf16", kv_bytes_per_token=6427)
    assert est.dtype == "bfloat16"
    assert est.refund_tokens == 134_217_728 // 6427 == 20_883


def test_float32_doubles_and_float16_matches_bfloat16():
    assert estimate_omission(tokens=4096, hidden=4096, hc_mult=4, dtype="float32").bytes == 2 * 134_217_728
    assert estimate_omission(tokens=4096, hidden=4096, hc_mult=4, dtype="float16").bytes == 134_217_728


def test_cli_json_document():
    code, out, _ = invoke("estimate", "--tokens", "4096", "--hidden", "4096", "--hc-mult", "4",
                          "--dtype", "bfloat16", "--json")
    assert code == 0
    doc = json.loads(out)
    assert doc["bytes"] == 134_217_728 and doc["mib"] == 128.0
    assert doc["schema"] == "dspark-patch/estimate/v1"


def test_cli_reads_a_model_config(tmp_path: Path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"architectures": ["DeepseekV4ForCausalLM"], "hidden_size": 4096,
                               "hc_mult": 4, "torch_dtype": "bfloat16"}))
    code, out, _ = invoke("estimate", "--config", str(cfg), "--max-num-batched-tokens", "4096", "--json")
    assert code == 0
    assert json.loads(out)["bytes"] == 134_217_728
    # --dtype overrides the config's dtype (the server's --dtype does the same).
    code, out, _ = invoke("estimate", "--config", str(cfg), "--max-num-batched-tokens", "4096",
                          "--dtype", "float32", "--json")
    assert json.loads(out)["bytes"] == 2 * 134_217_728


def test_config_with_newer_dtype_key_and_text_config(tmp_path: Path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"text_config": {"hidden_size": 7168, "hc_mult": 4}, "dtype": "float16"}))
    geo = read_model_config(cfg)
    assert (geo.hidden, geo.hc_mult, geo.dtype) == (7168, 4, "float16")


def test_config_without_hc_mult_is_bad_input_naming_the_field(tmp_path: Path):
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 4096, "torch_dtype": "bfloat16"}))
    code, _, message = invoke("estimate", "--config", str(cfg), "--tokens", "4096")
    assert code == 2
    assert "hc_mult" in message


def test_missing_inputs_and_unknown_dtype_are_bad_input(tmp_path: Path):
    code, _, message = invoke("estimate", "--tokens", "4096", "--hidden", "4096")
    assert code == 2 and "--hc-mult" in message and "--dtype" in message
    code, _, message = invoke("estimate", "--tokens", "4096", "--hidden", "4096", "--hc-mult", "4",
                              "--dtype", "int8")
    assert code == 2 and "int8" in message
    code, _, message = invoke("estimate", "--config", str(tmp_path / "absent.json"), "--tokens", "1")
    assert code == 2 and "absent.json" in message


@pytest.mark.slow
def test_formula_matches_the_allocation_in_real_vllm_0_33_0():
    """The estimate is only right while vLLM allocates the buffer this way; read the real source."""
    src = (vllm.python_sources("0.33.0") / "vllm/models/deepseek_v4/nvidia/model.py").read_text()
    assert "self.hc_dim = self.hc_mult * config.hidden_size" in src
    assert "self.hc_mult = config.hc_mult" in src
    allocation = re.search(r"self\._mtp_hidden_buffer = torch\.empty\((.*?)\)\n", src, re.S)
    assert allocation is not None
    args = [a.strip() for a in allocation.group(1).split(",") if a.strip()]
    assert args == [
        "vllm_config.scheduler_config.max_num_batched_tokens",
        "self.hc_dim",
        "dtype=vllm_config.model_config.dtype",
    ]
