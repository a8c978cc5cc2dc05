"""What `evaluate` records of the environment and the server's arguments it was given.

evaluation.json is uploaded as a CI artifact and printed by `--json`; passing `HF_TOKEN` and
`--api-key` to vLLM is the normal way to serve a gated model behind a key. So the record keeps
every variable's name and every option's name, and a value only where it is known to be safe
(docs/evidence.md, "evaluate"):

- an `--env` value is kept only for a variable named by `--record-env NAME`, and for the flag
  under test, whose value ("0"/"1") is the experiment;
- an argument's value is kept only where it is the value of an option on `SAFE_OPTIONS`, the
  vLLM options that describe the model and its geometry (name, parallel sizes, token budget,
  dtypes); everything else that is not an option name is `***`: the values of other options
  (`--api-key X`, `--api-key=X`), positional arguments, and anything that does not read as an
  option name.

The allow-list holds options that take a value, never boolean flags: the word after an allowed
option is then its value, never a positional argument that happened to follow a flag.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from .kvlog import FLAG

REDACTED = "***"

# vLLM 0.33.0's names (engine/arg_utils.py `EngineArgs.add_cli_args`, entrypoints/openai/cli_args.py)
# for the model and the figures the KV comparison depends on.
SAFE_OPTIONS = frozenset({
    "--model", "--served-model-name", "--tokenizer", "--revision",
    "--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
    "--data-parallel-size", "-dp", "--max-num-batched-tokens", "--max-model-len", "--max-num-seqs",
    "--gpu-memory-utilization", "--kv-cache-dtype", "--dtype", "--block-size", "--quantization", "-q",
    "--speculative-config", "--seed",
})
# `--name`, `-tp`: what reads as an option name and nothing else (a digit after one dash is a
# negative number, a value).
_OPTION = re.compile(r"--?[A-Za-z][A-Za-z0-9_.-]*")
# Values shorter than this are not scrubbed out of the saved server logs: "1" or "on" would
# change every figure; a secret is never this short.
_SCRUB_MIN = 4


@dataclass(frozen=True, kw_only=True)
class Recorded:
    """The environment and arguments as the report holds them, and what was left out."""

    env: tuple[tuple[str, str], ...]      # sorted; redacted values are REDACTED
    args: tuple[str, ...]
    redacted_env: tuple[str, ...]         # the variables whose values are REDACTED
    redacted_args: tuple[str, ...]        # per redacted value: the option it belongs to, or "argument N"
    secrets: tuple[str, ...]              # the values left out, to scrub from saved logs (never serialised)

    def scrub(self, text: str) -> str:
        """`text` with every value left out of the record replaced by REDACTED."""
        for value in sorted(self.secrets, key=len, reverse=True):
            text = text.replace(value, REDACTED)
        return text


def record(env: Mapping[str, str], args: Sequence[str], *, keep_env: Collection[str] = ()) -> Recorded:
    """What the report may hold of `env` and `args` (the rules in this module's docstring)."""
    kept_env: list[tuple[str, str]] = []
    redacted_env: list[str] = []
    secrets: list[str] = []
    for name, value in sorted(env.items()):
        if name == FLAG or name in keep_env:
            kept_env.append((name, value))
        else:
            kept_env.append((name, REDACTED))
            redacted_env.append(name)
            secrets.append(value)
    kept_args: list[str] = []
    redacted_args: list[str] = []
    previous: str | None = None   # the option the current word may be the value of
    for index, arg in enumerate(args, 1):
        name, eq, inline = arg.partition("=")
        if _OPTION.fullmatch(name):
            if eq and name not in SAFE_OPTIONS:
                kept_args.append(f"{name}={REDACTED}")
                redacted_args.append(name)
                secrets.append(inline)
            else:
                kept_args.append(arg)
            previous = None if eq else name
            continue
        if previous in SAFE_OPTIONS:
            kept_args.append(arg)
        else:
            kept_args.append(REDACTED)
            redacted_args.append(previous or f"argument {index}")
            secrets.append(arg)
        previous = None
    return Recorded(
        env=tuple(kept_env), args=tuple(kept_args), redacted_env=tuple(redacted_env),
        redacted_args=tuple(redacted_args),
        secrets=tuple(s for s in dict.fromkeys(secrets) if len(s) >= _SCRUB_MIN),
    )
