"""The probe reads each release's own structure: 0.32.0 passes, its mutants fail, 0.31.0 is refused.

The trees are real vLLM 0.32.0 and 0.31.0 installs with the 0.33.0 change hand-ported onto
them (tests/support/ports.py: the shipped diff's own added lines, placed at each release's
anchors by exact edits). Every 0.32.0 mutant is the correct port with one textual edit of a
class the 0.33.0 mutants (test_probe_mutants.py) cover, adapted to 0.32.0's layout: the
consumer's choice inline in DFlashSpeculator.propose, the drafter helper's fallback, the
FULL-graph prefill that combines rows eagerly. `dspark-patch probe` alone (no hash checks)
must exit 1 and name the promise that broke; the correct port, and DSpark overrides that only
pass through, exit 0.
"""

from __future__ import annotations

import pytest

from dspark_patch.probe.run import unguarded_readers
from dspark_patch.report.audit_json import from_json_dict
from tests.support import ports, probe_forks, probe_trees

pytestmark = pytest.mark.slow

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
PARTIAL = "consumer: partial FULL-graph staging stages and combines aux states, never reads the residual"
RESOLUTION = "consumer: _store_hidden_states resolves through DSparkSpeculator's bases"
CAPTURE = "graph capture: _prepare_graph_forward combines the staged aux states"
NEGATIVE = "consumer: without aux states it reads the residual (the poison is live)"
FLAG = "flag: VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER is registered and parses unset/0/1 as off/off/on"
NOT_PRESENT = "not present in this release"

CHOICE = (
    "        if aux_hidden_states:\n"
    "            hidden_states = self.model.combine_hidden_states(\n"
    "                torch.cat(aux_hidden_states, dim=-1)\n"
    "            )\n"
    "        else:\n"
    "            hidden_states = last_hidden_states\n"
    "        self.hidden_states[:num_target_tokens].copy_(hidden_states[:num_target_tokens])\n"
)
DSPARK_CLASS = '    _speculator_name = "DSpark"\n'
PROPOSE_ARGS = "input_batch, attn_metadata, slot_mappings, last_hidden_states, aux_hidden_states, *args, **kwargs"

# name -> (edits [(file, old, new)], cases that must fail, text one failing detail must hold)
MUTANTS_032: dict[str, tuple[list[tuple[str, str, str]], set[str], str]] = {
    "runner reads the accessor directly": (
        [(RUNNER, "spec_hidden_states = get_drafter_hidden_states(self.model, hidden_states)",
          "spec_hidden_states = self.model.get_mtp_target_hidden_states()[: hidden_states.shape[0]]")],
        {CENSUS, RUNNER_CASE}, f"{RUNNER}:937 GPUModelRunner._dummy_run",
    ),
    "a DSpark override of propose reads the residual before the FULL-graph prefill": (
        [(DSPARK, DSPARK_CLASS, DSPARK_CLASS + "\n"
          f"    def propose(self, {PROPOSE_ARGS}):\n"
          "        n = input_batch.num_tokens\n"
          "        self.hidden_states[:n].copy_(last_hidden_states[:n])\n"
          f"        return super().propose({PROPOSE_ARGS})\n")],
        {PASSES, EAGER}, "DSparkSpeculator.propose uses last_hidden_states",
    ),
    "propose keeps the residual for later": (
        [(DFLASH, "        num_reqs = input_batch.num_reqs\n        num_target_tokens = input_batch.num_tokens\n",
          "        self._residual = last_hidden_states\n"
          "        num_reqs = input_batch.num_reqs\n        num_target_tokens = input_batch.num_tokens\n")],
        {PASSES}, "DFlashSpeculator.propose uses last_hidden_states",
    ),
    "the inline consumer reads the residual with aux states": (
        [(DFLASH, "            hidden_states = self.model.combine_hidden_states(\n"
                  "                torch.cat(aux_hidden_states, dim=-1)\n            )\n",
          "            hidden_states = last_hidden_states\n")],
        {EAGER}, "DSpark must not read the MTP residual",
    ),
    "the FULL-graph prefill stores the residual past the graph's rows": (
        [(DFLASH, "                # Prefill context beyond the graph's rows is stored before replay.\n",
          "                # Prefill context beyond the graph's rows is stored before replay.\n"
          "                self.hidden_states[num_context:num_target_tokens].copy_(\n"
          "                    last_hidden_states[num_context:num_target_tokens]\n"
          "                )\n")],
        {PASSES}, "DFlashSpeculator.propose uses last_hidden_states",
    ),
    "the eager combine runs only outside dummy runs": (
        [(DFLASH, CHOICE, "        if not dummy_run:\n" + "".join(f"    {line}\n" for line in CHOICE.splitlines()))],
        {PARTIAL, REPLAY}, "is inside a branch of DFlashSpeculator.propose",
    ),
    "the eager combine stores only the first row": (
        [(DFLASH, "        self.hidden_states[:num_target_tokens].copy_(hidden_states[:num_target_tokens])\n",
          "        self.hidden_states[:1].copy_(hidden_states[:1])\n")],
        {EAGER}, "differ from the projected aux reference",
    ),
    "the fallback no longer reads the residual": (
        [(DFLASH, "        else:\n            hidden_states = last_hidden_states\n        self.hidden_states[:num_target",
          "        else:\n            hidden_states = torch.zeros_like(self.hidden_states)\n        self.hidden_states[:num_target")],
        {NEGATIVE}, "did not read the residual",
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
    "flag not registered": (
        [("vllm/envs.py", '    "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER": lambda: (',
          '    "VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER_X": lambda: (')],
        {FLAG}, "is not registered",
    ),
}

# DSpark overrides that only pass the residual through: a correct tree must still pass.
PASS_THROUGH_032 = {
    "propose(*args, **kwargs) -> super()": (DSPARK, DSPARK_CLASS, DSPARK_CLASS + "\n"
        "    def propose(self, *args, **kwargs):\n        return super().propose(*args, **kwargs)\n"),
    "propose(..., last_hidden_states, ...) -> super()": (DSPARK, DSPARK_CLASS, DSPARK_CLASS + "\n"
        f"    def propose(self, {PROPOSE_ARGS}):\n        return super().propose({PROPOSE_ARGS})\n"),
}
PASS_THROUGH_033 = {
    "_store_hidden_states -> super()": (DSPARK, DSPARK_CLASS, DSPARK_CLASS + "\n"
        "    def _store_hidden_states(self, num_tokens, last_hidden_states, aux_hidden_states, num_graph_tokens=0):\n"
        "        super()._store_hidden_states(num_tokens, last_hidden_states, aux_hidden_states, num_graph_tokens)\n"),
}


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory, patched033: probe_trees.SharedTree) -> dict[str, tuple[int, dict]]:
    root = tmp_path_factory.mktemp("releases")
    base32 = ports.ported_tree("0.32.0", root / "base32" / "site-packages")
    base33 = patched033.copy(root / "base33" / "site-packages")  # `apply --no-probe`, made once
    trees = {"0.32.0": base32, "0.31.0": ports.ported_tree("0.31.0", root / "base31" / "site-packages")}
    jobs: list[tuple[str, object, list[tuple[str, str, str]]]] = [
        *((name, base32, edits) for name, (edits, _f, _t) in MUTANTS_032.items()),
        *((f"pass: {name}", base32, [edit]) for name, edit in PASS_THROUGH_032.items()),
        *((f"pass: {name}", base33, [edit]) for name, edit in PASS_THROUGH_033.items()),
    ]
    for i, (name, base, edits) in enumerate(jobs):
        tree = probe_trees.copy_tree(base, root / f"m{i}" / "site-packages")
        for rel, old, new in edits:
            probe_trees.edit(tree, rel, old, new)
        trees[name] = tree
    return probe_forks.probe_many(trees)


def failing(report: dict) -> dict[str, str]:
    return {c["name"]: c["detail"] for c in report["probe"]["cases"] if not c["ok"]}


def cases(report: dict) -> dict[str, dict]:
    return {c["name"]: c for c in report["probe"]["cases"]}


def test_the_correct_032_port_passes_and_says_what_this_release_lacks(outcomes):
    code, report = outcomes["0.32.0"]
    assert code == 0, failing(report)
    by = cases(report)
    # 0.32.0 has no _store_hidden_states, aux staging or graph-replay preparation: each case
    # says so and names the one that carries the claim instead.
    for name in (RESOLUTION, PARTIAL, REPLAY):
        assert by[name]["ok"] and by[name]["detail"].startswith(NOT_PRESENT), (name, by[name])
    assert "inline in DFlashSpeculator.propose" in by[RESOLUTION]["detail"]
    assert "combines every row at line 383 unconditionally" in by[PARTIAL]["detail"]
    # The resolver is the one the runner imports (no class in DSpark's bases imports it here).
    assert "model_runner.py imports set_eagle3_aux_hidden_state_layers" in by[RESOLVER]["detail"]
    assert "context rows 0..12 from self.hidden_states" in by[CAPTURE]["detail"]
    reached = {(e["file"], e["function"]) for e in report["probe"]["census"] if e["reached"]}
    assert {(RUNNER, "GPUModelRunner._dummy_run"), (RUNNER, "GPUModelRunner.sample_tokens"),
            (UTILS, "get_drafter_hidden_states"), (MODEL, "DeepseekV4Model.forward")} <= reached


@pytest.mark.parametrize("name", list(MUTANTS_032))
def test_probe_alone_kills_each_032_mutant_with_a_named_case(outcomes, name):
    _edits, must_fail, text = MUTANTS_032[name]
    code, report = outcomes[name]
    assert code == 1, f"{name}: probe passed"
    failed = failing(report)
    assert must_fail <= set(failed), (name, sorted(failed))
    assert any(text in failed[c] for c in must_fail), (name, {c: failed[c] for c in must_fail})


@pytest.mark.parametrize("name", [*PASS_THROUGH_032, *PASS_THROUGH_033])
def test_a_dspark_override_that_only_passes_through_does_not_fail_a_correct_tree(outcomes, name):
    code, report = outcomes[f"pass: {name}"]
    assert code == 0, failing(report)


def test_031_patched_by_hand_is_refused_naming_each_unguarded_reader(outcomes):
    code, report = outcomes["0.31.0"]
    assert code == 1
    failed = failing(report)
    # Only what 0.31.0 lacks fails: the runner reads the accessor with no None check.
    assert set(failed) == {CENSUS, RUNNER_CASE, DRAFTER}, sorted(failed)
    bad = [(e["file"], e["line"], e["function"]) for e in report["probe"]["census"]
           if e["reached"] and not e["none_safe"]]
    assert bad == [(RUNNER, 905, "GPUModelRunner._dummy_run"), (RUNNER, 2196, "GPUModelRunner.sample_tokens")]
    for line, fn in ((905, "GPUModelRunner._dummy_run"), (2196, "GPUModelRunner.sample_tokens")):
        assert f"{RUNNER}:{line} {fn}" in failed[CENSUS] and f"{RUNNER}:{line} {fn}" in failed[RUNNER_CASE]
    assert failed[DRAFTER].startswith(NOT_PRESENT)
    # What `port --to 0.31.0` names: the same readers, read back from the saved report.
    read = from_json_dict(report)
    assert [(e.file, e.line, e.function) for e in unguarded_readers(read.probe)] == bad
    assert all(e["verdict"].startswith("FAIL: unguarded reader on the DSpark V2 path")
               for e in report["probe"]["census"] if e["reached"] and not e["none_safe"])
