"""A team's own patch sets, made from real vLLM trees for the series tests: a folder with
patch.toml and one diff, its hashes computed from the files it was made on (as `new` will)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from tests.support.trees import udiff

DSPARK = "dspark-skip-mtp-buffer"


def sha(data: bytes | None) -> str | None:
    return None if data is None else hashlib.sha256(data).hexdigest()


def write_set(folder: Path, pid: str, changes: dict[str, tuple[bytes | None, bytes | None]], *,
              release: str = "0.33.0", requires: tuple[str, ...] = ()) -> Path:
    """`changes`: path -> (before, after) (None: absent). Returns the patch set's folder."""
    root = folder / pid
    root.mkdir(parents=True)
    diff = b"".join(_file_diff(path, before, after) for path, (before, after) in sorted(changes.items()))
    (root / f"vllm-{release}.patch").write_bytes(diff)
    lines = [f'id = "{pid}"', f'title = "{pid}"', 'summary = "a team\'s own change"', 'distribution = "vllm"']
    if requires:
        lines.append("requires = [" + ", ".join(f'"{r}"' for r in requires) + "]")
    lines += ["", "[[variants]]", f'name = "vllm-{release}"', f'releases = ["{release}"]', f'diff = "vllm-{release}.patch"']
    for path, (before, after) in sorted(changes.items()):
        lines += ["", f'[variants.files."{path}"]']
        if before is not None:
            lines.append(f'pre_sha256 = "{sha(before)}"')
        if after is not None:
            lines.append(f'post_sha256 = "{sha(after)}"')
    (root / "patch.toml").write_text("\n".join(lines) + "\n")
    return root


def _file_diff(path: str, before: bytes | None, after: bytes | None) -> bytes:
    text = udiff(before or b"", after or b"", path)
    if before is None:
        text = text.replace(b"--- a/" + path.encode(), b"--- /dev/null", 1)
    if after is None:
        text = text.replace(b"+++ b/" + path.encode(), b"+++ /dev/null", 1)
    return text


def team_edit(tree: Path) -> dict[str, tuple[bytes | None, bytes | None]]:
    """The team's change on `tree` (one that carries the DSpark patch): a flag of its own in
    vllm/envs.py, which DSpark also changes, and a line in vllm/logger.py, which it does not."""
    envs = (tree / "vllm/envs.py").read_bytes()
    logger = (tree / "vllm/logger.py").read_bytes()
    return {
        "vllm/envs.py": (envs, envs + b"\n# team: a flag of our own\nVLLM_TEAM_FLAG = 1\n"),
        "vllm/logger.py": (logger, logger + b"\n# team: a note in the logger\n"),
    }
