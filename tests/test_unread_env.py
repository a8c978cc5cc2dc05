"""Configuration nothing reads (unread_env.py), pure: a variable a known patch set introduces,
set by an image whose installed vLLM does not read it, is one note line; set and read, or not
set, is none. And the patch set's `env` key is data its diffs prove (patchset.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from dspark_patch import unread_env
from dspark_patch.errors import InvalidPatchSet
from dspark_patch.patchset import ENVS_FILE, load_dir, resolve

FLAG = "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER"
SHIPPED = resolve("dspark-skip-mtp-buffer")
# vLLM 0.34.0's envs.py has no such name; the patched 0.33.0 one reads it.
UNREAD = b'environment_variables = {\n    "VLLM_USAGE_SOURCE": lambda: os.getenv("VLLM_USAGE_SOURCE"),\n}\n'
READ = UNREAD.replace(b"}\n", b'    "' + FLAG.encode() + b'": lambda: os.getenv("X"),\n}\n')


def _notes(config: dict, envs_py: bytes | None, release: str = "0.34.0") -> list[str]:
    files = {ENVS_FILE: envs_py} if envs_py is not None else {}
    return unread_env.notes(unread_env.settings(config), [SHIPPED], files.get, distribution="vllm", release=release)


def test_the_shipped_set_declares_its_flag() -> None:
    assert SHIPPED.env == (FLAG,)


def test_set_in_env_and_unread_is_one_note() -> None:
    assert _notes({"Env": ["PATH=/usr/bin", f"{FLAG}=1"]}, UNREAD) == [
        f"{FLAG} is set in the image's Env but vllm 0.34.0 does not read it (introduced by dspark-skip-mtp-buffer): "
        "remove it"]


def test_set_and_read_is_no_note() -> None:
    assert _notes({"Env": [f"{FLAG}=1"]}, READ) == []
    assert _notes({"Env": [f"{FLAG}=1"]}, READ.replace(b'"', b"'")) == []


def test_not_set_is_no_note() -> None:
    assert _notes({"Env": ["PATH=/usr/bin", "VLLM_USAGE_SOURCE=production-docker-image"]}, UNREAD) == []
    assert _notes({}, UNREAD) == []


def test_set_by_the_entrypoint_is_named_so() -> None:
    config = {"Entrypoint": ["tini", "--", "env", f"{FLAG}=1", "vllm", "serve"]}
    assert _notes(config, UNREAD) == [
        f"{FLAG} is set in the image's entrypoint (env NAME=VALUE) but vllm 0.34.0 does not read it "
        "(introduced by dspark-skip-mtp-buffer): remove it"]


def test_a_release_the_set_covers_is_told_to_apply_it() -> None:
    # 0.33.0 unpatched: the flag does nothing until the patch set is applied.
    assert _notes({"Env": [f"{FLAG}=1"]}, UNREAD, release="0.33.0")[0].endswith(
        "(introduced by dspark-skip-mtp-buffer): apply dspark-skip-mtp-buffer, or remove it")


def test_an_unreadable_envs_py_says_nothing() -> None:
    assert _notes({"Env": [f"{FLAG}=1"]}, None) == []


def _copy(tmp_path: Path, env_line: str | None) -> Path:
    folder = tmp_path / SHIPPED.id  # type: ignore[operator]
    shutil.copytree(SHIPPED.source, folder)
    toml = folder / "patch.toml"
    text = "\n".join(line for line in toml.read_text(encoding="utf-8").splitlines() if not line.startswith("env = "))
    toml.write_text(text.replace('probe_beside = "--census"', 'probe_beside = "--census"\n' + (env_line or "")),
                    encoding="utf-8")
    return folder


@pytest.mark.parametrize("line, message", [
    ('env = ["VLLM_SOMETHING_ELSE", "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER"]', "does not add"),
    ("env = []", "which env does not name"),
    ('env = ["lower"]', "must list environment variable names"),
])
def test_an_env_key_its_diffs_do_not_prove_is_refused(tmp_path: Path, line: str, message: str) -> None:
    with pytest.raises(InvalidPatchSet, match=message):
        load_dir(_copy(tmp_path, line))


def test_a_set_without_the_key_claims_nothing(tmp_path: Path) -> None:
    assert load_dir(_copy(tmp_path, None)).env == ()
