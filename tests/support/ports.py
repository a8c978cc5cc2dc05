"""A hand port of the shipped 0.33.0 change to another release's real files, for probe tests.

The logic is the 0.33.0 variant's own: every line the shipped diff adds is taken from it, hunk
by hunk, and placed at the target release's anchor by an exact string edit that must match
once. Only the anchors are the port's: 0.32.0 (and 0.31.0) have no VLLM_REQUEST_BODY_LOG_LEVEL,
so the flag goes after VLLM_ENABLE_HPC_OPS in the annotations and after
VLLM_SKIP_VERSION_SUFFIX, the table's last entry; the import goes after AttentionBackendEnum's,
which 0.32.0 follows with the ubatching import. No fuzz: an anchor that is missing or not
unique fails the test that asked for the port.

`port_tree(tree, release)` edits a hard-linked test tree by replacing files
(`vllm.replace_file`), never writing through the cache's inodes.
"""

from __future__ import annotations

from pathlib import Path

from unidiff import PatchSet as UniPatchSet

from tests.support import vllm

REPO = Path(__file__).resolve().parents[2]
SHIPPED_DIFF = REPO / "patches" / "dspark-skip-mtp-buffer" / "vllm-0.33.0.patch"
ENVS = "vllm/envs.py"
MODEL = "vllm/models/deepseek_v4/nvidia/model.py"

# Releases whose envs.py and model.py share these anchors (checked on the real wheels).
PORTABLE = ("0.32.0", "0.31.0")

ENV_ANNOTATION_ANCHOR = "    VLLM_ENABLE_HPC_OPS: bool = False\n"
ENV_TABLE_ANCHOR = (
    '    "VLLM_SKIP_VERSION_SUFFIX": lambda: bool(\n'
    '        int(os.getenv("VLLM_SKIP_VERSION_SUFFIX", "0"))\n'
    "    ),\n"
)
IMPORT_ANCHOR = "from vllm.v1.attention.backends.registry import AttentionBackendEnum\n"
LOGGER_ANCHOR = "logger = init_logger(__name__)\n\n\n"
ALLOCATION_ANCHOR = "        if get_pp_group().is_last_rank and needs_mtp_hidden_states:\n"


def added_blocks() -> dict[str, list[list[str]]]:
    """Per file, each run of consecutive added lines of the shipped 0.33.0 diff, in order."""
    blocks: dict[str, list[list[str]]] = {}
    for patched in UniPatchSet(SHIPPED_DIFF.read_text()):
        rel = patched.path
        runs: list[list[str]] = []
        for hunk in patched:
            run: list[str] = []
            for line in hunk:
                if line.is_added:
                    run.append(line.value)
                elif run:
                    runs.append(run)
                    run = []
            if run:
                runs.append(run)
        blocks[rel] = runs
    return blocks


def _insert_after(source: str, anchor: str, text: str, rel: str) -> str:
    assert source.count(anchor) == 1, f"{rel}: anchor {anchor!r} occurs {source.count(anchor)} times"
    return source.replace(anchor, anchor + text)


def ported_sources(envs: str, model: str) -> tuple[str, str]:
    """The 0.33.0 change placed into another release's envs.py and model.py texts."""
    blocks = added_blocks()
    env_runs, model_runs = blocks[ENVS], blocks[MODEL]
    assert len(env_runs) == 2 and len(model_runs) == 3, (len(env_runs), len(model_runs))
    envs = _insert_after(envs, ENV_ANNOTATION_ANCHOR, "".join(env_runs[0]), ENVS)
    envs = _insert_after(envs, ENV_TABLE_ANCHOR, "".join(env_runs[1]), ENVS)
    imports, decision, allocation = model_runs
    model = _insert_after(model, IMPORT_ANCHOR, "".join(imports), MODEL)
    model = _insert_after(model, LOGGER_ANCHOR, "".join(decision), MODEL)
    # The 0.33.0 hunk replaces the allocation's `if` by the skip branch and an `elif`.
    assert allocation[-1] == ALLOCATION_ANCHOR.replace("        if ", "        elif ", 1), allocation[-1]
    assert model.count(ALLOCATION_ANCHOR) == 1, f"{MODEL}: allocation anchor not unique"
    model = model.replace(ALLOCATION_ANCHOR, "".join(allocation))
    return envs, model


def port_tree(tree: Path, release: str) -> Path:
    """Apply the hand port to a test tree of `release` (one of PORTABLE), in place."""
    assert release in PORTABLE, release
    envs, model = ported_sources((tree / ENVS).read_text(), (tree / MODEL).read_text())
    vllm.replace_file(tree / ENVS, envs.encode())
    vllm.replace_file(tree / MODEL, model.encode())
    return tree


def ported_tree(release: str, where: Path) -> Path:
    """A fresh real `release` site-packages with the hand port applied."""
    return port_tree(vllm.tree_copy(release, where), release)
