"""`dspark-patch probe` alone (no hash checks) kills each class of broken variant.

Every mutant is a correctly patched real vLLM 0.33.0 tree (applied through the CLI) with one
textual edit of the kind a careless port makes; the probe must exit 1 and name the promise that
broke. The correct tree must exit 0. The probes run a few at a time: each is a subprocess
that imports torch and walks the whole tree.
"""

from __future__ import annotations

import pytest

from tests.support import probe_forks, probe_trees

MODEL = "vllm/models/deepseek_v4/nvidia/model.py"
RUNNER = "vllm/v1/worker/gpu/model_runner.py"
DFLASH = "vllm/v1/worker/gpu/spec_decode/dflash/speculator.py"
DSPARK = "vllm/v1/worker/gpu/spec_decode/dspark/speculator.py"
UTILS = "vllm/v1/worker/gpu/spec_decode/utils.py"

CENSUS = "census: no unguarded reader of _mtp_hidden_buffer on the DSpark V2 path"
RUNNER_CASE = "runner: the V2 runner feeds the drafter only through get_drafter_hidden_states"
FORWARD = "forward: copies into _mtp_hidden_buffer only when it is allocated"
REPLAY = "graph replay: _prepare_graph_replay never reads the residual"
PASSES = "speculator: every DSpark method receiving last_hidden_states only hands it to the checked consumers"
BOUNDS = "decision: layer ids 1..N skip, 0, N+1 and negative keep the buffer"
RESOLVER = "decision: uses the runner's own layer-id resolver"
PREFERRED = "decision: layer ids are the ones the runner resolves (preferred key, DFlash config, V4.1)"
DFLASH_CASE = "decision: DFlash keeps the buffer"
IMPORTS = "decision: its imports resolve in the installed tree"
PP = "decision: pipeline parallel size 2 keeps the buffer"
DRAFTER = "drafter: get_drafter_hidden_states falls back to the regular hidden states without the buffer"
EAGER = "consumer: an eager step combines the aux states, never reads the residual"
FLAG = "flag: VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER is registered and parses unset/0/1 as off/off/on"

# name -> (edits [(file, old, new)], cases that must fail, text one failing detail must hold)
MUTANTS: dict[str, tuple[list[tuple[str, str, str]], set[str], str]] = {
    "runner reads the accessor directly": (
        [(RUNNER, "spec_hidden_states = get_drafter_hidden_states(self.model, hidden_states)",
          "spec_hidden_states = self.model.get_mtp_target_hidden_states()[: hidden_states.shape[0]]")],
        {CENSUS, RUNNER_CASE}, f"{RUNNER}:958 GPUModelRunner._dummy_run",
    ),
    "a DSpark override reads the residual during graph replay": (
        [(DSPARK, '    _speculator_name = "DSpark"\n',
          '    _speculator_name = "DSpark"\n\n'
          "    def _prepare_graph_replay(self, input_batch, num_graph_reqs, last_hidden_states,\n"
          "                              aux_hidden_states, num_rejected, dummy_run):\n"
          "        n = input_batch.num_tokens\n"
          "        self.hidden_states[:n].copy_(last_hidden_states[:n])\n")],
        {REPLAY}, "the MTP residual (last_hidden_states) was read",
    ),
    "propose keeps the residual for later": (
        [(DFLASH, "        num_reqs = input_batch.num_reqs\n        if dummy_run and dp_sync_state",
          "        self._residual = last_hidden_states\n"
          "        num_reqs = input_batch.num_reqs\n        if dummy_run and dp_sync_state")],
        {PASSES}, "DFlashSpeculator.propose uses last_hidden_states",
    ),
    "forward guard removed": (
        [(MODEL, "        if self._mtp_hidden_buffer is not None:\n            num_tokens = hidden_states.shape[0]\n",
          "        if True:\n            num_tokens = hidden_states.shape[0]\n")],
        {CENSUS, FORWARD}, "DeepseekV4Model.forward",
    ),
    "lower layer-id bound off by one": (
        [(MODEL, "1 <= layer_id <= num_target_layers", "0 <= layer_id <= num_target_layers")],
        {BOUNDS}, "0 (dspark id -1)",
    ),
    "upper layer-id bound off by one": (
        [(MODEL, "1 <= layer_id <= num_target_layers", "1 <= layer_id < num_target_layers")],
        {BOUNDS}, "upper bound N=43",
    ),
    "decision bypasses the runner's resolver": (
        [(MODEL, "    layer_ids = get_eagle3_aux_layers_from_config(spec_config)\n",
          "    hf_config = spec_config.draft_model_config.hf_config\n"
          "    layer_ids = [i + 1 for i in (getattr(hf_config, 'dspark_target_layer_ids', None) or [])]\n")],
        {RESOLVER, PREFERRED}, "bypasses the runner's layer-id resolver",
    ),
    "DFlash also skips": (
        [(MODEL, "not spec_config.use_dspark()",
          "not (spec_config.use_dspark() or spec_config.use_dflash())")],
        {DFLASH_CASE}, "dflash, V2, PP1",
    ),
    "broken import in the decision's module": (
        [(MODEL, "from vllm.v1.worker.gpu.spec_decode.eagle.eagle3_utils import (\n    get_eagle3_aux",
          "from vllm.v1.worker.gpu.spec_decode.eagle3_utils import (\n    get_eagle3_aux")],
        {IMPORTS}, "vllm.v1.worker.gpu.spec_decode.eagle3_utils is not in the installed tree",
    ),
    "decision ignores pipeline parallelism": (
        [(MODEL, "    if vllm_config.parallel_config.pipeline_parallel_size != 1:\n        return False\n", "")],
        {PP}, "PP2",
    ),
    "drafter helper lost its fallback": (
        [(UTILS, "    if target_hidden_states is None:\n        return hidden_states\n", "")],
        {DRAFTER, CENSUS}, f"{UTILS}:",
    ),
    "a DSpark override of the consumer reads the residual": (
        [(DSPARK, '    _speculator_name = "DSpark"\n',
          '    _speculator_name = "DSpark"\n\n'
          "    def _store_hidden_states(self, num_tokens, last_hidden_states, aux_hidden_states,"
          " num_graph_tokens=0):\n"
          "        self.hidden_states[:num_tokens].copy_(last_hidden_states[:num_tokens])\n")],
        {EAGER, REPLAY}, "DSpark must not read the MTP residual",
    ),
    "flag not registered": (
        [("vllm/envs.py", '    "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER": lambda: (',
          '    "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER_X": lambda: (')],
        {FLAG}, "is not registered",
    ),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, patched033: probe_trees.SharedTree) -> dict[str, tuple[int, dict]]:
    root = tmp_path_factory.mktemp("mutants")
    base = patched033.copy(root / "base" / "site-packages")  # `apply --no-probe`, made once
    trees = {"correct": base}
    for i, (name, (edits, _f, _t)) in enumerate(MUTANTS.items()):
        tree = probe_trees.copy_tree(base, root / f"m{i}" / "site-packages")
        for rel, old, new in edits:
            probe_trees.edit(tree, rel, old, new)
        trees[name] = tree
    return probe_forks.probe_many(trees)


def failing(report: dict) -> dict[str, str]:
    return {c["name"]: c["detail"] for c in report["probe"]["cases"] if not c["ok"]}


def test_the_correctly_patched_tree_passes_with_its_census(outcomes):
    code, report = outcomes["correct"]
    assert code == 0, failing(report)
    census = report["probe"]["census"]
    reached = [e for e in census if e["reached"]]
    assert reached and all(e["none_safe"] for e in reached)
    # The readers the claim rests on are all listed, each with where and what.
    where = {(e["file"], e["function"]) for e in reached}
    assert (MODEL, "DeepseekV4Model.forward") in where
    assert (RUNNER, "GPUModelRunner.sample_tokens") in where
    assert (UTILS, "get_drafter_hidden_states") in where
    # The V1 runner's reader is listed but not on the DSpark V2 path.
    v1 = [e for e in census if e["file"] == "vllm/v1/worker/gpu_model_runner.py"]
    assert v1 and not any(e["reached"] for e in v1)


@pytest.mark.parametrize("name", list(MUTANTS))
def test_probe_alone_kills_the_mutant_with_a_named_case(outcomes, name):
    _edits, must_fail, text = MUTANTS[name]
    code, report = outcomes[name]
    assert code == 1, f"{name}: probe passed"
    failed = failing(report)
    assert must_fail <= set(failed), (name, sorted(failed))
    assert any(text in failed[c] for c in must_fail), (name, {c: failed[c] for c in must_fail})
    assert report["probe"]["ok"] is False and report["exit_code"] == 1


def test_the_census_survives_the_saved_report_and_renders_as_a_table(outcomes, tmp_path):
    from dspark_patch.report.audit_json import from_json_dict
    from dspark_patch.report.render import render_as
    from dspark_patch.serialise import to_data

    _code, report = outcomes["runner reads the accessor directly"]
    read = from_json_dict(report)
    assert to_data(read)["probe"]["census"] == report["probe"]["census"]
    bad = [e for e in read.probe.census if e.reached and not e.none_safe]
    assert [(e.file, e.line) for e in bad] == [(RUNNER, 958)]
    md = render_as(read, "md")
    assert "#### Census: every reader the probe's claim rests on" in md
    assert f"`{RUNNER}:958`" in md and "FAIL: unguarded reader on the DSpark V2 path" in md
