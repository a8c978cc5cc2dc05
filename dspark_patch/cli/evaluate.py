"""`estimate`, `kv-compare` and `evaluate`: the KV-refund evidence as commands with a verdict.

Each command builds a request, hands it to `dspark_patch.evaluate`, and renders the result:
a rich summary for people, or with `--json` only the JSON document on stdout. A failing
verdict raises `EvaluationFailed` (exit 1) after the result is shown.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from ..errors import BadInput, EvaluationFailed
from ..evaluate.compare import DEFAULT_TOLERANCE_GIB, compare_logs
from ..evaluate.estimate import DTYPE_BYTES, estimate_omission, read_model_config
from ..evaluate.kvlog import FLAG, read_server_log
from ..evaluate.model import EvaluationResult, KvComparison, OmissionEstimate
from ..evaluate.runs import evaluate_image, parse_env_items
from ..serialise import dumps
from . import output

_JSON = typer.Option(False, "--json", help="Print only the JSON document on stdout.")
_TOLERANCE = typer.Option(
    DEFAULT_TOLERANCE_GIB, "--tolerance", metavar="GIB",
    help="Allowed gap between a rank's KV memory change and its omitted MiB "
    "(default: two figures printed to 0.01 GiB).",
)
_EXPECT_MIB = typer.Option(
    None, "--expect-mib", metavar="MIB",
    help="Also require each rank's omission line to say this many MiB (from `estimate`).",
)


def _print_json(result: Any) -> None:
    output.write(dumps(result))


def estimate(
    tokens: int | None = typer.Option(
        None, "--tokens", "--max-num-batched-tokens", metavar="N",
        help="Rows of the buffer: the server's max_num_batched_tokens.",
    ),
    hidden: int | None = typer.Option(None, "--hidden", metavar="H", help="hidden_size."),
    hc_mult: int | None = typer.Option(None, "--hc-mult", metavar="M", help="hc_mult (DeepSeek-V4)."),
    dtype: str | None = typer.Option(
        None, "--dtype", metavar="|".join(DTYPE_BYTES), help="Model dtype (overrides the config's)."
    ),
    config: Path | None = typer.Option(
        None, "--config", metavar="CONFIG.JSON", help="Read hidden_size, hc_mult and dtype from it."
    ),
    kv_bytes_per_token: int | None = typer.Option(
        None, "--kv-bytes-per-token", metavar="B", help="One rank's KV bytes per token: gives the refund."
    ),
    as_json: bool = _JSON,
) -> None:
    """The bytes the patch leaves unallocated per GPU, and the expected token refund."""
    if config is not None:
        geometry = read_model_config(config)
        hidden = hidden if hidden is not None else geometry.hidden
        hc_mult = hc_mult if hc_mult is not None else geometry.hc_mult
        dtype = dtype if dtype is not None else geometry.dtype
    missing = [name for name, value in (
        ("--tokens", tokens), ("--hidden", hidden), ("--hc-mult", hc_mult), ("--dtype", dtype),
    ) if value is None]
    if missing:
        raise BadInput(
            "estimate needs " + ", ".join(missing),
            hint="give them, or --config CONFIG.JSON with --max-num-batched-tokens N",
        )
    result = estimate_omission(
        tokens=tokens, hidden=hidden, hc_mult=hc_mult, dtype=dtype,  # type: ignore[arg-type]
        kv_bytes_per_token=kv_bytes_per_token, config=str(config) if config else None,
    )
    if as_json:
        _print_json(result)
        return
    _show_estimate(result)


def kv_compare(
    off_log: Path = typer.Argument(..., metavar="OFF.log", help="Server log with the flag off."),
    on_log: Path = typer.Argument(..., metavar="ON.log", help="Server log with the flag on."),
    as_json: bool = _JSON,
    tolerance: float = _TOLERANCE,
    expect_mib: float | None = _EXPECT_MIB,
) -> None:
    """Compare two vLLM server logs (flag off, flag on) and give a verdict on the KV refund."""
    if tolerance < 0:
        raise BadInput(f"--tolerance must not be negative, got {tolerance}")
    result = compare_logs(
        read_server_log(off_log), read_server_log(on_log),
        tolerance_gib=tolerance, expect_mib=expect_mib,
    )
    if as_json:
        _print_json(result)
    else:
        _show_comparison(result)
    if not result.passed:
        raise EvaluationFailed(f"kv-compare: {len(result.reasons)} check(s) failed: {result.reasons[0]}")


def evaluate(
    image: str = typer.Option(..., "--image", metavar="REF", help="The (patched) image to evaluate."),
    server_args: list[str] | None = typer.Argument(
        None, metavar="-- SERVER_ARGS...", help="Arguments for the image's entrypoint, the same in both runs.",
    ),
    env: list[str] = typer.Option([], "--env", metavar="K=V", help="Environment for both runs (repeatable). "
                                  "The report records the names; values only with --record-env."),
    record_env: list[str] = typer.Option(
        [], "--record-env", metavar="NAME",
        help="Record this --env variable's value in the report, not *** (repeatable; for values that "
        "are safe to publish, such as HF_HOME). Server arguments' values are recorded only for "
        "options that describe the model and its geometry (docs/evidence.md).",
    ),
    timeout: float = typer.Option(1800.0, "--timeout", metavar="S", help="Per run: seconds to wait for the KV lines."),
    report_dir: Path = typer.Option(
        Path("dspark-evaluation"), "--report-dir", metavar="DIR", help="Where the report and both logs go."
    ),
    gpus: bool = typer.Option(True, "--gpus/--no-gpus", help="Request all GPUs for the server (--gpus all)."),
    as_json: bool = _JSON,
    tolerance: float = _TOLERANCE,
    expect_mib: float | None = _EXPECT_MIB,
) -> None:
    """Start the SAME image twice, flag off then on, and compare the KV capacity they report."""
    from ..targets.docker import DockerEngine  # the engine is needed only by this command

    result = evaluate_image(
        DockerEngine(), image_ref=image, server_args=list(server_args or ()),
        env=parse_env_items(env), report_dir=report_dir, timeout=timeout, gpus=gpus,
        tolerance_gib=tolerance, expect_mib=expect_mib, record_env=tuple(record_env),
    )
    if as_json:
        _print_json(result)
    else:
        _show_evaluation(result)
    if not result.passed:
        raise EvaluationFailed(
            f"evaluate: {len(result.reasons)} check(s) failed: {result.reasons[0]} "
            f"(report: {result.report_file})"
        )


def register(app: typer.Typer) -> None:
    app.command("estimate")(estimate)
    app.command("kv-compare")(kv_compare)
    app.command("evaluate")(evaluate)


# --- rendering for people ------------------------------------------------------------------
def _show_estimate(result: OmissionEstimate) -> None:
    output.show_rich(
        f"_mtp_hidden_buffer: {result.tokens:,} x ({result.hc_mult} x {result.hidden:,}) "
        f"{result.dtype} = [bold]{result.bytes:,} bytes[/bold] ({result.mib:,.2f} MiB) per GPU"
    )
    if result.refund_tokens is not None:
        output.show_rich(
            f"expected refund: {result.refund_tokens:,} tokens at {result.kv_bytes_per_token:,} KV bytes/token"
        )


def _fmt(value: Any, spec: str = "") -> str:
    return "-" if value is None else format(value, spec)


def _show_comparison(result: KvComparison, *, verdict: bool = True) -> None:
    table = Table(title="KV cache per rank (flag off -> on)")
    for column in ("rank", "KV GiB off", "KV GiB on", "delta GiB", "omitted MiB on", "expected GiB", "ok"):
        table.add_column(column)
    for r in result.ranks:
        table.add_row(
            r.rank, _fmt(r.kv_gib_off), _fmt(r.kv_gib_on), _fmt(r.delta_gib, "+.2f"),
            _fmt(r.omitted_mib_on, ".2f"), _fmt(r.expected_delta_gib, ".4f"),
            "[green]yes[/green]" if r.ok else "[red]no[/red]",
        )
    output.show_rich(table)
    output.show_rich(
        f"tokens: {_fmt(result.tokens_off, ',')} -> {_fmt(result.tokens_on, ',')} "
        f"({_fmt(result.delta_tokens, '+,')}, {_fmt(result.delta_pct, '+.2f')}%); "
        f"expected about {_fmt(result.expected_delta_tokens, '+,')}"
    )
    output.show_rich(
        f"{FLAG} omission on: off run {list(result.omission_ranks_off) or 'none'}, "
        f"on run {list(result.omission_ranks_on) or 'none'}"
    )
    if verdict:
        for note in result.notes:
            output.show_rich(f"[yellow]note[/yellow]: {note}")
        _show_verdict(result.verdict, result.reasons)


def _show_evaluation(result: EvaluationResult) -> None:
    output.show_rich(f"image {result.image_ref} ({result.image_id}), GPUs {'all' if result.gpus else 'none'}")
    for run in result.runs:
        output.show_rich(
            f"  flag {run.flag} ({FLAG}={run.flag_value}): container {run.container_id[:12]}, "
            f"ready={run.ready}, exit={_fmt(run.exit_code)}, log {run.log_file}"
        )
    if result.redacted_env or result.redacted_args:
        output.show_rich(
            "recorded as ***: " + escape(", ".join([*(f"--env {name}" for name in result.redacted_env),
                                                    *dict.fromkeys(result.redacted_args)]))
        )
    _show_comparison(result.comparison, verdict=False)
    for note in result.notes:
        output.show_rich(f"[yellow]note[/yellow]: {note}")
    _show_verdict(result.verdict, result.reasons)
    output.show_rich(f"report: {result.report_file}")


def _show_verdict(verdict: str, reasons: tuple[str, ...] | list[str]) -> None:
    if verdict == "pass":
        output.show_rich("[bold green]PASS[/bold green]")
        return
    output.show_rich("[bold red]FAIL[/bold red]")
    for reason in reasons:
        output.show_rich(f"  - {reason}")
