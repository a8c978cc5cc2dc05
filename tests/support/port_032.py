"""The hand resolution of porting dspark-skip-mtp-buffer from vllm-0.33.0 to vLLM 0.32.0.

`dspark-patch port --to 0.32.0` stops at conflicts in both files (docs/porting.md). This is what
the person resolving them did, written as exact edits (each must match exactly once), so the
tests repeat it and the shipped vllm-0.32.0 variant is what they produce:

- envs.py: 0.32.0 has no VLLM_REQUEST_BODY_LOG_LEVEL, the anchor of both hunks. The type
  annotation goes after the last one of the TYPE_CHECKING block (VLLM_ENABLE_HPC_OPS), the
  entry after the last entry of `environment_variables` (VLLM_SKIP_VERSION_SUFFIX), inside
  the dict's closing brace (where `patch -F3` does not put it).
- model.py: the decision function and the allocation site landed; the import conflicts only
  because 0.32.0 imports dbo_current_ubatch_id where 0.33.0 imports bf16_mega_gate: both
  imports stay, in isort order. The docstring names 0.32.0's consumer: the choice between aux
  states and the residual is made inline in DFlashSpeculator.propose.
"""

from __future__ import annotations

from pathlib import Path

ENVS = "vllm/envs.py"
MODEL = "vllm/models/deepseek_v4/nvidia/model.py"

_ANNOTATION_AFTER = '    VLLM_ENABLE_HPC_OPS: bool = False\n\n\ndef get_default_cache_root():\n'
_ANNOTATION = '    VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER: bool = False\n'
_ENTRY_AFTER = '        int(os.getenv("VLLM_SKIP_VERSION_SUFFIX", "0"))\n    ),\n'
_ENTRY = (
    '    # Opt-in (patch set dspark-skip-mtp-buffer): DeepSeek V4 does not allocate\n'
    '    # its _mtp_hidden_buffer for DSpark on Model Runner V2 with valid auxiliary\n'
    '    # layers and PP=1, since DSpark reads only the auxiliary hidden states.\n'
    '    # Unset or "0": off. "1": on. Any other value is an error.\n'
    '    "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER": lambda: (\n'
    '        env_with_choices("VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER", "0", ["0", "1"])()\n'
    '        == "1"\n'
    '    ),\n'
)
_IMPORT_CONFLICT = (
    '<<<<<<< variant\n'
    'from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (\n'
    '    get_eagle3_aux_layers_from_config,\n'
    ')\n'
    '=======\n'
    'from vllm.v1.worker.ubatching import dbo_current_ubatch_id\n'
    '>>>>>>> target\n'
)
_IMPORTS = (
    'from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (\n'
    '    get_eagle3_aux_layers_from_config,\n'
    ')\n'
    'from vllm.v1.worker.ubatching import dbo_current_ubatch_id\n'
)
def _once(text: str, old: str, new: str, what: str) -> str:
    count = text.count(old)
    if count != 1:
        raise AssertionError(f"{what}: expected exactly one match, found {count}")
    return text.replace(old, new)


def resolve(files: Path, pristine_envs: bytes) -> None:
    """Resolve the work folder's conflicts (files = WORK/files) as the reviewer did."""
    envs = pristine_envs.decode("utf-8")
    envs = _once(envs, _ANNOTATION_AFTER, _ANNOTATION_AFTER.replace('False\n', 'False\n' + _ANNOTATION, 1), "envs annotation")
    envs = _once(envs, _ENTRY_AFTER + '}\n', _ENTRY_AFTER + _ENTRY + '}\n', "envs entry")
    (files / ENVS).write_text(envs, encoding="utf-8")
    model = (files / MODEL).read_text(encoding="utf-8")
    model = _once(model, _IMPORT_CONFLICT, _IMPORTS, "model import conflict")
    (files / MODEL).write_text(model, encoding="utf-8")
