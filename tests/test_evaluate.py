"""kv-compare verdicts and `evaluate`: the flag-off/flag-on pair on one image."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import docker
import pytest
import typer
from typer.testing import CliRunner

from dspark_patch.cli.evaluate import register
from dspark_patch.errors import BadInput, DsparkPatchError
from dspark_patch.evaluate.compare import compare_logs
from dspark_patch.evaluate.kvlog import FLAG, parse_server_log
from dspark_patch.evaluate.redact import record
from dspark_patch.evaluate.runs import check_no_experiment_flags, evaluate_image
from dspark_patch.evaluate.server import run_server
from dspark_patch.targets.docker import DockerEngine
from tests.support import images

DATA = Path(__file__).parent / "data"
KVLOGS = DATA / "kvlogs"
OFF = (KVLOGS / "tp2-v0.33-off.log").read_text()
ON = (KVLOGS / "tp2-v0.33-on.log").read_text()


def invoke(*args: str):
    app = typer.Typer()
    register(app)
    result = CliRunner().invoke(app, list(args))
    if isinstance(result.exception, DsparkPatchError):
        return result.exception.exit_code, result.stdout, result.exception.line()
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    return result.exit_code, result.stdout, ""


def compare(off: str, on: str, **kw):
    return compare_logs(parse_server_log(off, source="OFF.log"), parse_server_log(on, source="ON.log"), **kw)


def without(text: str, *needles: str) -> str:
    return "".join(l for l in text.splitlines(True) if not all(n in l for n in needles))


# --- verdicts -----------------------------------------------------------------------------
@pytest.mark.parametrize("release", ["0.33", "0.10"])
def test_seed_figures_pass(release: str):
    off = (KVLOGS / f"tp2-v{release}-off.log").read_text()
    on = (KVLOGS / f"tp2-v{release}-on.log").read_text()
    result = compare(off, on)
    assert result.verdict == "pass", result.reasons
    assert (result.tokens_off, result.tokens_on, result.delta_tokens) == (1_129_474, 1_150_350, 20_876)
    assert round(result.delta_pct, 2) == 1.85
    assert (result.kv_gib_off, result.kv_gib_on) == (6.76, 6.89)
    assert result.omission_ranks_off == () and result.omission_ranks_on == ("TP0", "TP1")


def test_cli_json_keys_and_exit_code_on_pass():
    code, out, _ = invoke("kv-compare", str(KVLOGS / "tp2-v0.33-off.log"), str(KVLOGS / "tp2-v0.33-on.log"), "--json")
    assert code == 0
    doc = json.loads(out)
    for key in ("tokens_off", "tokens_on", "delta_tokens", "delta_pct", "kv_gib_off", "kv_gib_on",
                "omission_ranks_off", "omission_ranks_on", "ranks", "verdict", "reasons"):
        assert key in doc
    assert doc["verdict"] == "pass" and doc["delta_tokens"] == 20_876
    assert [r["rank"] for r in doc["ranks"]] == ["TP0", "TP1"]


def test_omission_on_one_rank_only_fails_naming_the_other():
    result = compare(OFF, without(ON, "Worker_TP1", FLAG))
    assert result.verdict == "fail"
    assert result.omission_ranks_on == ("TP0",)
    assert any("ON.log" in r and "omission" in r and "TP1" in r for r in result.reasons), result.reasons


def test_omission_in_the_disabled_run_fails():
    omission = next(l for l in ON.splitlines(True) if FLAG in l and "Worker_TP0" in l)
    result = compare(omission + OFF, ON)
    assert result.verdict == "fail"
    assert result.omission_ranks_off == ("TP0",)
    assert any("OFF.log" in r and "TP0" in r and "flag was off" in r for r in result.reasons)


def test_tokens_dropped_fails():
    on = ON.replace("1,150,350 tokens", "1,129,000 tokens")
    result = compare(OFF, on)
    assert result.verdict == "fail"
    assert result.delta_tokens == -474
    assert any("dropped" in r and "1,129,474" in r for r in result.reasons)


@pytest.mark.parametrize(("log", "needles", "expected"), [
    ("off", ("Worker_TP1", "Available KV cache memory"), ("OFF.log", "Available KV cache memory", "TP1")),
    ("on", ("Worker_TP0", "Available KV cache memory"), ("ON.log", "Available KV cache memory", "TP0")),
    ("on", ("GPU KV cache size",), ("ON.log", "KV cache size", "DP0")),
])
def test_missing_line_fails_naming_file_kind_and_rank(log, needles, expected):
    off, on = (without(OFF, *needles), ON) if log == "off" else (OFF, without(ON, *needles))
    result = compare(off, on)
    assert result.verdict == "fail"
    assert any(all(part in r for part in expected) for r in result.reasons), result.reasons


def test_refund_outside_rounding_fails_and_inside_passes():
    # 6.76 -> 6.90 is +0.14 GiB for 0.125 GiB omitted: beyond the two figures' rounding.
    result = compare(OFF, ON.replace("Available KV cache memory: 6.89", "Available KV cache memory: 6.90"))
    assert result.verdict == "fail"
    assert any("TP0" in r and "+0.14 GiB" in r and "128.00 MiB" in r for r in result.reasons)
    # 6.76 -> 6.88 is +0.12: within +/-0.01 of 0.125.
    assert compare(OFF, ON.replace("memory: 6.89", "memory: 6.88")).verdict == "pass"


def test_expect_mib_checks_the_logged_omission():
    assert compare(OFF, ON, expect_mib=128).verdict == "pass"
    result = compare(OFF, ON, expect_mib=256)
    assert result.verdict == "fail" and any("256.00 MiB" in r for r in result.reasons)


def test_cli_fail_exits_1_and_unreadable_exits_2(tmp_path: Path):
    bad_on = tmp_path / "on.log"
    bad_on.write_text(without(ON, "Worker_TP1", FLAG))
    code, out, message = invoke("kv-compare", str(KVLOGS / "tp2-v0.33-off.log"), str(bad_on), "--json")
    assert code == 1
    assert json.loads(out)["verdict"] == "fail"
    assert "TP1" in message
    code, _, message = invoke("kv-compare", str(tmp_path / "nope.log"), str(bad_on))
    assert code == 2 and "nope.log" in message


# --- evaluate: refusals -------------------------------------------------------------------
class NoEngine:
    """Stands in for the Docker engine where nothing may be started."""

    def image_info(self, ref):
        raise AssertionError("the image must not be looked at before the arguments are checked")

    def started(self, *a, **kw):
        raise AssertionError("no server may start")


@pytest.mark.parametrize(("env", "args", "named"), [
    ({"VLLM_PCAI_OTHER_EXPERIMENT": "1"}, [], "VLLM_PCAI_OTHER_EXPERIMENT"),
    ({FLAG: "1"}, [], FLAG),
    ({}, ["--model", "m", "--kv-cache-dtype", "turboquant_k8v4"], "turboquant_k8v4"),
    ({}, ["--kv-cache-dtype=ultraquant_4bit"], "ultraquant_4bit"),
    ({}, ["--use-packed-scales"], "--use-packed-scales"),
    ({}, ["--env-file", "VLLM_PCAI_FOO=1"], "VLLM_PCAI_FOO=1"),
])
def test_evaluate_refuses_other_experiment_flags(tmp_path: Path, env, args, named):
    with pytest.raises(BadInput) as caught:
        evaluate_image(NoEngine(), image_ref="img", server_args=args, env=env,
                       report_dir=tmp_path / "r", timeout=10, gpus=False)
    assert named in caught.value.line()
    assert not (tmp_path / "r").exists()


def test_evaluate_refuses_an_image_that_sets_another_experiment_flag():
    with pytest.raises(BadInput, match="VLLM_PCAI_PACKED=1"):
        check_no_experiment_flags(env={}, server_args=[], image_env=["PATH=/usr/bin", "VLLM_PCAI_PACKED=1"])
    check_no_experiment_flags(env={"HF_HOME": "/cache"}, server_args=["--kv-cache-dtype", "fp8"])


@pytest.mark.engine  # the image is inspected before the flags are judged
def test_evaluate_cli_refusal_exits_2_naming_the_item(tmp_path: Path):
    code, _, message = invoke("evaluate", "--image", "any", "--no-gpus", "--report-dir", str(tmp_path),
                              "--env", "VLLM_PCAI_X=1", "--", "--model", "m")
    assert code == 2 and "VLLM_PCAI_X" in message


# --- evaluate: what the report records of the environment and the arguments ---------------
def test_evaluate_records_env_names_and_flag_values_and_only_named_values():
    recorded = record({"HF_TOKEN": "hf_canary_token", "HF_HOME": "/models/cache", FLAG: "1"}, [],
                      keep_env=["HF_HOME"])
    assert recorded.env == (("HF_HOME", "/models/cache"), ("HF_TOKEN", "***"), (FLAG, "1"))
    assert recorded.redacted_env == ("HF_TOKEN",)
    assert recorded.scrub("token=hf_canary_token home=/models/cache") == "token=*** home=/models/cache"


@pytest.mark.parametrize(("args", "kept", "which"), [
    (["--api-key", "sk-canary", "--model", "org/m", "--tensor-parallel-size", "2"],
     ["--api-key", "***", "--model", "org/m", "--tensor-parallel-size", "2"], ["--api-key"]),
    (["--api-key=sk-canary", "-tp", "2", "--max-num-batched-tokens=4096"],
     ["--api-key=***", "-tp", "2", "--max-num-batched-tokens=4096"], ["--api-key"]),
    # A positional, and a word after a flag that takes no value, may be anything: not recorded.
    (["serve", "org/m", "--enforce-eager", "hunter22", "--seed", "-1"],
     ["***", "***", "--enforce-eager", "***", "--seed", "-1"], ["argument 1", "argument 2", "--enforce-eager"]),
])
def test_evaluate_records_option_names_and_only_allow_listed_values(args, kept, which):
    recorded = record({}, args)
    assert list(recorded.args) == kept
    assert list(recorded.redacted_args) == which


def test_evaluate_refuses_a_password_in_the_image_reference_without_repeating_it(tmp_path: Path):
    with pytest.raises(BadInput) as caught:
        evaluate_image(NoEngine(), image_ref="alice:CANARYpw@127.0.0.1:5000/m:1", server_args=[], env={},
                       report_dir=tmp_path / "r", timeout=10, gpus=False)
    assert "CANARY" not in caught.value.line() and "***@127.0.0.1:5000/m:1" in caught.value.line()
    assert not (tmp_path / "r").exists()


def test_evaluate_record_env_must_name_a_given_variable(tmp_path: Path):
    with pytest.raises(BadInput, match="--record-env HF_HOMR"):
        evaluate_image(NoEngine(), image_ref="img", server_args=[], env={"HF_HOME": "/c"},
                       report_dir=tmp_path / "r", timeout=10, gpus=False, record_env=["HF_HOMR"])
    assert not (tmp_path / "r").exists()


# --- evaluate end to end, on a real engine, with a TEST DOUBLE of a vLLM server -------------
@pytest.fixture(scope="module")
def kvlog_double() -> str:
    """Build the TEST DOUBLE image (tests/data/kvlog-double) on the project's bookworm base."""
    base = images.base_image()
    context = DATA / "kvlog-double"
    digest = hashlib.sha256(base.encode())
    for name in sorted(p.name for p in context.iterdir()):
        digest.update(name.encode() + (context / name).read_bytes())
    tag = f"dspark-patch/kvlog-double:{digest.hexdigest()[:12]}"
    client = docker.from_env()
    try:
        client.images.get(tag)
    except docker.errors.ImageNotFound:
        client.images.build(path=str(context), buildargs={"BASE": base}, tag=tag, rm=True,
                            network_mode="none")
    return tag


def _double_env(log: str) -> dict[str, str]:
    prefix = "TEST-DOUBLE env: "
    return dict(l[len(prefix):].split("=", 1) for l in log.splitlines() if l.startswith(prefix))


@pytest.mark.engine
def test_evaluate_with_the_kv_log_double_passes_with_the_same_image_and_only_the_flag_differing(
    tmp_path: Path, kvlog_double: str,
):
    report = tmp_path / "report"
    code, out, message = invoke(
        "evaluate", "--image", kvlog_double, "--no-gpus", "--timeout", "60", "--report-dir", str(report),
        "--env", "HF_HOME=/models/cache", "--record-env", "HF_HOME", "--json",
        "--", "--model", "/models/x", "--tensor-parallel-size", "2",
    )
    assert code == 0, message
    doc = json.loads(out)
    assert doc["verdict"] == "pass", doc["reasons"]
    off, on = doc["runs"]
    image_id = docker.from_env().images.get(kvlog_double).id
    assert off["image_id"] == on["image_id"] == doc["image_id"] == image_id
    assert (off["flag_value"], on["flag_value"]) == ("0", "1")
    assert off["args"] == on["args"] == ["--model", "/models/x", "--tensor-parallel-size", "2"]
    assert ["HF_HOME", "/models/cache"] in off["env"] and doc["redacted_env"] == doc["redacted_args"] == []
    # What the servers themselves saw: same args, same environment but for the flag.
    logs = [(report / "server-flag-off.log").read_text(), (report / "server-flag-on.log").read_text()]
    for log in logs:
        assert "TEST-DOUBLE args: --model /models/x --tensor-parallel-size 2" in log
    env_off, env_on = (_double_env(log) for log in logs)
    assert (env_off.pop(FLAG), env_on.pop(FLAG)) == ("0", "1")
    env_off.pop("HOSTNAME"), env_on.pop("HOSTNAME")   # the container's own name
    assert env_off == env_on and env_on["HF_HOME"] == "/models/cache"
    # The report on disk is the document printed, with the comparison inside.
    saved = json.loads((report / "evaluation.json").read_text())
    assert saved == doc
    assert saved["comparison"]["delta_tokens"] == 20_876
    assert saved["comparison"]["omission_ranks_on"] == ["TP0", "TP1"]


@pytest.mark.engine
def test_evaluate_with_the_kv_log_double_records_no_secret_value_and_says_which_it_left_out(
    tmp_path: Path, kvlog_double: str,
):
    report = tmp_path / "report"
    code, out, message = invoke(
        "evaluate", "--image", kvlog_double, "--no-gpus", "--timeout", "60", "--report-dir", str(report),
        "--env", "HF_TOKEN=hf_CANARYtoken", "--json",
        "--", "--model", "/models/x", "--api-key", "sk-CANARYkey", "--tensor-parallel-size=2",
    )
    assert code == 0, message
    doc = json.loads(out)
    assert doc["verdict"] == "pass", doc["reasons"]
    assert doc["redacted_env"] == ["HF_TOKEN"] and doc["redacted_args"] == ["--api-key"]
    for run in doc["runs"]:
        assert ["HF_TOKEN", "***"] in run["env"] and [FLAG, run["flag_value"]] in run["env"]
        assert run["args"] == ["--model", "/models/x", "--api-key", "***", "--tensor-parallel-size=2"]
    assert "CANARY" not in out
    # The servers saw the values; nothing written to the report folder holds them.
    for path in report.iterdir():
        assert "CANARY" not in path.read_text(), path.name
    assert "--api-key ***" in (report / "server-flag-on.log").read_text()


@pytest.mark.engine
def test_evaluate_with_the_kv_log_double_fails_when_one_rank_keeps_its_buffer(tmp_path: Path, kvlog_double: str):
    code, out, message = invoke(
        "evaluate", "--image", kvlog_double, "--no-gpus", "--timeout", "60",
        "--report-dir", str(tmp_path), "--env", "KVLOG_DOUBLE_MODE=one-rank", "--json",
    )
    assert code == 1
    doc = json.loads(out)
    assert doc["verdict"] == "fail"
    assert doc["comparison"]["omission_ranks_on"] == ["TP0"]
    assert "TP1" in message
    assert (tmp_path / "evaluation.json").exists() and (tmp_path / "server-flag-on.log").exists()


@pytest.mark.engine
def test_evaluate_with_the_kv_log_double_server_dying_before_its_kv_lines_fails_naming_them(
    tmp_path: Path, kvlog_double: str,
):
    code, out, _ = invoke(
        "evaluate", "--image", kvlog_double, "--no-gpus", "--timeout", "60",
        "--report-dir", str(tmp_path), "--env", "KVLOG_DOUBLE_MODE=no-kv", "--json",
    )
    assert code == 1
    doc = json.loads(out)
    assert [run["exit_code"] for run in doc["runs"]] == [1, 1]
    assert any("exited (code 1)" in note for note in doc["notes"])
    # The on run logged its omission for TP0 and TP1, so the missing lines are named per rank.
    for log in ("server-flag-off.log", "server-flag-on.log"):
        for rank in ("TP0", "TP1"):
            assert any(log in r and "Available KV cache memory" in r and rank in r for r in doc["reasons"])
        assert any(log in r and "KV cache size" in r for r in doc["reasons"])


# --- one server run, on a real engine --------------------------------------------------------
def _my_containers(engine: DockerEngine) -> set[str]:
    """Containers of ours made by this test process (other runs may share the engine)."""
    return {name for _, name in engine.our_containers() if f"--{os.getpid()}--" in name}


@pytest.mark.engine
def test_run_server_follows_the_log_until_the_pattern_then_removes_it():
    engine = DockerEngine()
    ref = images.server_double_image()
    run = run_server(
        engine, engine.image_info(ref).id, env={"DOUBLE_GREETING": "hello"}, command_args=["--port", "9000"],
        gpus=False, until=lambda log: "server ready" in log, timeout=60,
    )
    assert run.matched and not run.timed_out and run.exit_code is None
    assert "with args: --port 9000" in run.log
    assert "DOUBLE_GREETING=hello" in run.log
    assert "Available KV cache memory: 6.76 GiB" in run.log
    assert _my_containers(engine) == set()


@pytest.mark.engine
def test_run_server_reports_an_exit():
    engine = DockerEngine()
    run = run_server(
        engine, engine.image_info(images.server_double_image()).id, env={}, command_args=["--exit-now"],
        gpus=False, until=lambda log: "server ready" in log, timeout=60,
    )
    assert not run.matched and run.exit_code == 3
    assert "exiting as asked" in run.log
    assert _my_containers(engine) == set()
