"""How much memory the patch leaves unallocated, and what that should give back in KV tokens.

DeepseekV4Model allocates `_mtp_hidden_buffer` as
`torch.empty(max_num_batched_tokens, hc_mult * hidden_size, dtype=model dtype)` on the last PP
rank (vllm/models/deepseek_v4/nvidia/model.py:907 in 0.33.0), so the omission is exactly
tokens x hidden x hc_mult x dtype size per GPU. The field names are those of the model's
config.json: `hidden_size`, `hc_mult` (read as `config.hc_mult`, model.py:837) and
`torch_dtype` (or `dtype`, its newer name in transformers).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import ownfiles
from ..errors import BadInput
from .model import OmissionEstimate

MIB = 1 << 20
GIB = 1 << 30

DTYPE_BYTES: dict[str, int] = {"bfloat16": 2, "float16": 2, "float32": 4}

CONFIG_LIMIT = 16 << 20   # a Hugging Face config.json is a few KB

# Spellings a config.json or a torch repr may use for the three dtypes.
_DTYPE_ALIASES = {
    "bfloat16": "bfloat16", "bf16": "bfloat16", "torch.bfloat16": "bfloat16",
    "float16": "float16", "fp16": "float16", "half": "float16", "torch.float16": "float16",
    "float32": "float32", "fp32": "float32", "float": "float32", "torch.float32": "float32",
}


@dataclass(frozen=True, kw_only=True)
class ModelGeometry:
    hidden: int
    hc_mult: int
    dtype: str | None      # None when the config names none (then --dtype must say it)


def normalize_dtype(name: str) -> str:
    """'bf16', 'torch.bfloat16', 'bfloat16' -> 'bfloat16'; anything else is refused."""
    found = _DTYPE_ALIASES.get(name.strip().lower())
    if found is None:
        raise BadInput(
            f"unknown dtype {name!r}",
            hint="use one of " + ", ".join(DTYPE_BYTES),
        )
    return found


def estimate_omission(
    *, tokens: int, hidden: int, hc_mult: int, dtype: str,
    kv_bytes_per_token: int | None = None, config: str | None = None,
) -> OmissionEstimate:
    """The omitted bytes for one GPU and, given the KV bytes per token, the expected refund."""
    for name, value in (("tokens", tokens), ("hidden", hidden), ("hc-mult", hc_mult)):
        if value <= 0:
            raise BadInput(f"--{name} must be a positive integer, got {value}")
    if kv_bytes_per_token is not None and kv_bytes_per_token <= 0:
        raise BadInput(f"--kv-bytes-per-token must be a positive integer, got {kv_bytes_per_token}")
    dtype = normalize_dtype(dtype)
    size = DTYPE_BYTES[dtype]
    omitted = tokens * hidden * hc_mult * size
    return OmissionEstimate(
        tokens=tokens, hidden=hidden, hc_mult=hc_mult, dtype=dtype, dtype_bytes=size,
        bytes=omitted, mib=omitted / MIB,
        kv_bytes_per_token=kv_bytes_per_token,
        refund_tokens=None if kv_bytes_per_token is None else omitted // kv_bytes_per_token,
        config=config,
    )


def read_model_config(path: Path) -> ModelGeometry:
    """hidden_size, hc_mult and the dtype from a Hugging Face config.json.

    A multimodal config keeps the language model's fields under `text_config`; the top level
    wins when both have them.
    """
    data = ownfiles.read_json(path, limit=CONFIG_LIMIT, what="model config")
    if not isinstance(data, dict):
        raise BadInput(f"{path} is not a JSON object")
    text: dict[str, Any] = data["text_config"] if isinstance(data.get("text_config"), dict) else {}

    def field(*names: str) -> Any:
        for scope in (data, text):
            for name in names:
                if scope.get(name) is not None:
                    return scope[name]
        return None

    hidden = field("hidden_size")
    hc_mult = field("hc_mult")
    for name, value in (("hidden_size", hidden), ("hc_mult", hc_mult)):
        if type(value) is not int or value <= 0:
            raise BadInput(
                f"{path} has no positive integer {name!r} (found {value!r})",
                hint="the MTP hidden buffer exists only for DeepSeek-V4 models; "
                "pass --hidden and --hc-mult instead" if name == "hc_mult" else None,
            )
    dtype = field("torch_dtype", "dtype")
    return ModelGeometry(
        hidden=hidden, hc_mult=hc_mult,
        dtype=normalize_dtype(dtype) if isinstance(dtype, str) else None,
    )

