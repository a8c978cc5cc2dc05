"""The flag-off / flag-on pair: one image, started twice, differing only in the flag.

The rules of the evaluation (docs/dspark-mtp-buffer.md) are enforced here, before anything
starts: the same image id for both runs; the same arguments and environment; no other
experiment flags. The flag is set explicitly in both runs ("0", then "1") rather than unset in
the first, so an image whose own config sets it cannot turn the "off" run on; vLLM's patched
envs.py accepts exactly "0" and "1".

The engine is a parameter (`ServerEngine`, what `targets.docker.DockerEngine` offers), so this
module never touches Docker itself; each run is `server.run_server`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from ..errors import BadInput
from ..imageref import ImageRef
from ..serialise import dumps
from .compare import DEFAULT_TOLERANCE_GIB, compare_logs
from .kvlog import FLAG, parse_server_log
from .model import EvaluationResult, FlagState, ServerRunLog
from .redact import record
from .server import ContainerEngine, run_server

FLAG_VALUES: dict[FlagState, str] = {"off": "0", "on": "1"}
EXPERIMENT_PREFIX = "VLLM_PCAI_"
REPORT_FILE = "evaluation.json"

# vLLM 0.33.0 has no option named for packed scales. What packs values with their scales is the
# "packed KV backend" chosen by --kv-cache-dtype (engine/arg_utils.py:2336
# `uses_packed_kv_backend`: turboquant_* and ultraquant_4bit, config/cache.py `CacheDType`);
# it changes the KV bytes per token and so the refund, and is refused. Any option whose name
# says "packed" (a fork's or a later release's) is refused as well.
PACKED_KV_CACHE_DTYPE_PREFIXES = ("turboquant_", "ultraquant_")
KV_CACHE_DTYPE_OPTION = "--kv-cache-dtype"


class ImageLike(Protocol):
    @property
    def id(self) -> str: ...
    @property
    def config(self) -> dict[str, Any]: ...   # the image's Config; its "Env" is checked


class ServerEngine(ContainerEngine, Protocol):
    def image_info(self, ref: str) -> ImageLike: ...


def parse_env_items(items: Sequence[str]) -> dict[str, str]:
    """`--env K=V` items as a dict; a malformed or repeated item is bad input."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or any(c.isspace() for c in key):
            raise BadInput(f"--env {item!r} is not KEY=VALUE")
        if key in env:
            raise BadInput(f"--env {key} is given twice")
        env[key] = value
    return env


def check_no_experiment_flags(
    *, env: Mapping[str, str], server_args: Sequence[str], image_env: Sequence[str] = (),
    image_ref: str = "the image",
) -> None:
    """Refuse any experiment flag other than the one under test; the message names it."""
    for key in env:
        if key == FLAG:
            raise BadInput(
                f"--env {key}: evaluate sets {FLAG} itself (0 for the off run, 1 for the on run)",
                hint="remove it from --env",
            )
        if key.startswith(EXPERIMENT_PREFIX):
            raise BadInput(
                f"--env {key}: another experiment flag; the evaluation compares {FLAG} alone",
                hint="remove it from --env",
            )
    for item in image_env:
        key = item.partition("=")[0]
        if key.startswith(EXPERIMENT_PREFIX) and key != FLAG:
            raise BadInput(
                f"{image_ref} sets {item!r} in its own environment: another experiment flag "
                "would be on in both runs",
                hint="evaluate an image without it",
            )
    for index, arg in enumerate(server_args):
        if EXPERIMENT_PREFIX in arg:
            raise BadInput(
                f"server argument {arg!r} carries an experiment flag",
                hint=f"the evaluation compares {FLAG} alone; remove it",
            )
        name, _, inline = arg.partition("=")
        if name.startswith("--") and "packed" in name.lower():
            raise BadInput(f"server argument {arg!r}: packed-scale options are not allowed")
        if name == KV_CACHE_DTYPE_OPTION:
            value = inline if "=" in arg else (
                server_args[index + 1] if index + 1 < len(server_args) else ""
            )
            if value.startswith(PACKED_KV_CACHE_DTYPE_PREFIXES):
                raise BadInput(
                    f"server argument {KV_CACHE_DTYPE_OPTION} {value}: a packed KV cache "
                    "(values with packed scales) is not allowed in this evaluation",
                    hint="use the default or an fp8 KV cache dtype, the same in both runs",
                )


def data_parallel_size(server_args: Sequence[str]) -> int:
    """How many engines (EngineCore processes) will print a KV capacity line."""
    for index, arg in enumerate(server_args):
        name, sep, inline = arg.partition("=")
        if name in ("--data-parallel-size", "-dp"):
            value = inline if sep else (server_args[index + 1] if index + 1 < len(server_args) else "")
            if not value.isdigit() or int(value) < 1:
                raise BadInput(f"server argument {arg}: not a positive data-parallel size")
            return int(value)
    return 1


def server_ready(log: str, *, engines: int = 1) -> bool:
    """The stop condition: every engine has printed its KV capacity and the server is up (or
    every rank has printed its final graph capture, which is as far as the KV story goes)."""
    parsed = parse_server_log(log, source="server")
    with_tokens = sum(1 for e in parsed.engines if e.tokens is not None)
    if with_tokens < engines:
        return False
    ranks = [r for r in parsed.ranks if r.kv_gib is not None]
    return parsed.ready or (bool(ranks) and all(r.graph_capture_gib is not None for r in ranks))


def evaluate_image(
    engine: ServerEngine, *, image_ref: str, server_args: Sequence[str],
    env: Mapping[str, str], report_dir: Path, timeout: float, gpus: bool = True,
    tolerance_gib: float = DEFAULT_TOLERANCE_GIB, expect_mib: float | None = None,
    record_env: Collection[str] = (),
) -> EvaluationResult:
    """Start the image flag off, then flag on; compare the two logs; write the report.

    The report records `env` and `server_args` as evaluate/redact.py allows: names always,
    values only of `record_env`'s variables, the flag and the allow-listed options; the saved
    server logs have the values left out replaced as well."""
    if timeout <= 0:
        raise BadInput(f"--timeout must be positive, got {timeout}")
    unknown = sorted(set(record_env) - set(env) - {FLAG})
    if unknown:
        raise BadInput(f"--record-env {unknown[0]}: no --env {unknown[0]}=VALUE is given",
                       hint="name a variable given with --env")
    # Arguments first: a refusal must not depend on the image being there.
    ImageRef.refuse_userinfo(image_ref)
    check_no_experiment_flags(env=env, server_args=server_args)
    info = engine.image_info(image_ref)
    image_env = tuple((info.config or {}).get("Env") or ())
    check_no_experiment_flags(env={}, server_args=(), image_env=image_env, image_ref=image_ref)
    engines = data_parallel_size(server_args)
    try:
        report_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise BadInput(f"cannot create report folder {report_dir}: {exc.strerror or exc}") from exc

    records: list[ServerRunLog] = []
    logs: dict[FlagState, str] = {}
    reasons: list[str] = []
    notes: list[str] = []
    for state in ("off", "on"):
        run_env = {**env, FLAG: FLAG_VALUES[state]}
        recorded = record(run_env, server_args, keep_env=record_env)
        run = run_server(
            engine, info.id, env=run_env, command_args=list(server_args), gpus=gpus,
            until=lambda text: server_ready(text, engines=engines), timeout=timeout,
        )
        log_file = report_dir / f"server-flag-{state}.log"
        log_file.write_text(recorded.scrub(run.log), encoding="utf-8")
        logs[state] = run.log
        if run.image_id != info.id:
            reasons.append(f"the flag-{state} run used image {run.image_id}, not {info.id}")
        # A run that stopped early fails through its missing lines; this says why they are missing.
        if run.timed_out:
            notes.append(f"the flag-{state} server was not ready within {timeout:g} s; stopped")
        elif not run.matched:
            notes.append(
                f"the flag-{state} server exited (code {run.exit_code}) before printing its KV figures; "
                f"see {log_file}"
            )
        records.append(ServerRunLog(
            flag=state, flag_value=FLAG_VALUES[state], image_id=run.image_id,
            container_id=run.container_id, env=recorded.env,
            args=recorded.args, exit_code=run.exit_code, ready=run.matched,
            log_file=str(log_file),
        ))

    comparison = compare_logs(
        parse_server_log(logs["off"], source=records[0].log_file),
        parse_server_log(logs["on"], source=records[1].log_file),
        tolerance_gib=tolerance_gib, expect_mib=expect_mib,
    )
    reasons.extend(comparison.reasons)
    report_file = report_dir / REPORT_FILE
    result = EvaluationResult(
        image_ref=image_ref, image_id=info.id, gpus=gpus, timeout_s=timeout,
        runs=(records[0], records[1]), comparison=comparison,
        report_dir=str(report_dir), report_file=str(report_file),
        verdict="fail" if reasons else "pass", reasons=tuple(reasons),
        notes=(*notes, *comparison.notes),
        redacted_env=recorded.redacted_env, redacted_args=recorded.redacted_args,
    )
    report_file.write_text(dumps(result), encoding="utf-8")
    return result
