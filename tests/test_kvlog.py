"""Reading vLLM server logs: real message formats, process prefixes, interleaved ranks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dspark_patch.errors import BadInput
from dspark_patch.evaluate.kvlog import parse_server_log, process_of, read_server_log
from tests.support import vllm

DATA = Path(__file__).parent / "data" / "kvlogs"


def test_v033_tp2_log_gives_each_rank_its_figures():
    log = read_server_log(DATA / "tp2-v0.33-on.log")
    assert [r.rank for r in log.ranks] == ["TP0", "TP1"]
    for rank in log.ranks:
        assert rank.kv_gib == 6.89
        assert rank.omitted_mib == 128.0
        # V2 runner: the profiling capture (0.90 GiB) comes before the KV line, the real one after.
        assert rank.graph_capture_gib == 0.61
        assert rank.graph_estimate_gib == 0.92
    assert [(e.engine, e.tokens) for e in log.engines] == [("DP0", 1_150_350)]
    assert log.capacity_format == "merged"
    assert log.ready and not log.conflicts


def test_flag_off_log_has_no_omission():
    log = read_server_log(DATA / "tp2-v0.33-off.log")
    assert [r.omitted_mib for r in log.ranks] == [None, None]
    assert [r.kv_gib for r in log.ranks] == [6.76, 6.76]
    assert log.engines[0].tokens == 1_129_474


def test_older_separate_lines_with_colored_prefixes_and_repeats():
    log = read_server_log(DATA / "tp2-v0.10-on.log")
    assert log.capacity_format == "separate"
    assert [(r.rank, r.kv_gib, r.omitted_mib) for r in log.ranks] == [
        ("TP0", 6.89, 128.0), ("TP1", 6.89, 128.0)
    ]
    assert log.engines[0].tokens == 1_150_350
    assert not log.conflicts   # the pair is logged twice with equal values


def test_interleaved_ranks_keep_their_own_values():
    text = "\n".join([
        "(Worker_PP0_TP1 pid=12) INFO 11-29 14:04:09 [gpu_worker.py:773] Available KV cache memory: 7.01 GiB",
        "(Worker_PP0_TP0 pid=11) INFO 11-29 14:04:09 [gpu_worker.py:773] Available KV cache memory: 6.50 GiB",
        "(Worker_PP0_TP1 pid=12) INFO 11-29 14:00:41 [model.py:946] VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER=1: "
        "skipped _mtp_hidden_buffer (2048 x 16384, torch.bfloat16): 64.00 MiB not allocated on this rank",
        "(EngineCore_DP1 pid=5) INFO 11-29 14:04:10 [kv_cache_utils.py:1148] GPU KV cache size: 9,000 tokens, "
        "Maximum concurrency for 1,000 tokens per request: 9.00x",
        "(EngineCore_DP0 pid=4) INFO 11-29 14:04:10 [kv_cache_utils.py:1148] GPU KV cache size: 8,000 tokens, "
        "Maximum concurrency for 1,000 tokens per request: 8.00x",
    ])
    log = parse_server_log(text, source="x.log")
    assert [(r.rank, r.kv_gib, r.omitted_mib) for r in log.ranks] == [
        ("PP0_TP0", 6.50, None), ("PP0_TP1", 7.01, 64.0)
    ]
    assert [(e.engine, e.tokens) for e in log.engines] == [("DP0", 8000), ("DP1", 9000)]


def test_a_line_without_prefix_is_rank_0_of_a_single_process_run():
    text = (
        "INFO 04-29 22:59:31 [gpu_worker.py:773] Available KV cache memory: 11.15 GiB\n"
        "INFO 04-29 22:59:31 [kv_cache_utils.py:634] GPU KV cache size: 417,520 tokens\n"
        "INFO 04-29 22:59:31 [kv_cache_utils.py:637] Maximum concurrency for 16,384 tokens per request: 25.48x\n"
    )
    log = parse_server_log(text, source="single.log")
    assert [(r.rank, r.kv_gib) for r in log.ranks] == [("rank0", 11.15)]
    assert (log.engines[0].engine, log.engines[0].tokens) == ("DP0", 417_520)
    assert log.capacity_format == "separate"


@pytest.mark.parametrize(("line", "rank", "engine"), [
    ("(Worker_TP1 pid=1234) INFO x", "TP1", "DP0"),
    ("(Worker_PP0_TP0 pid=1) INFO x", "PP0_TP0", "DP0"),
    ("(Worker_DP1_TP0 pid=1) INFO x", "DP1_TP0", "DP1"),
    ("(EngineCore_DP0 pid=1) INFO x", "DP0", "DP0"),
    ("(EngineCore pid=1) INFO x", "rank0", "DP0"),
    ("(EngineCore_1 pid=1) INFO x", "DP1", "DP1"),
    ("(VllmWorker TP3 pid=1) INFO x", "TP3", "DP0"),
    ("(VllmWorker rank=2 pid=1) INFO x", "rank2", "DP0"),
    ("container-1  | (Worker_TP1 pid=9) INFO x", "TP1", "DP0"),
    ("INFO 11-29 14:00:00 [gpu_worker.py:773] x", "rank0", "DP0"),
])
def test_process_prefixes_anywhere_in_the_line(line: str, rank: str, engine: str):
    assert process_of(line) == (rank, engine)


def test_the_same_figure_twice_with_different_values_is_a_conflict():
    text = (
        "(Worker_TP0 pid=1) INFO [gpu_worker.py:773] Available KV cache memory: 6.76 GiB\n"
        "(Worker_TP0 pid=1) INFO [gpu_worker.py:773] Available KV cache memory: 6.80 GiB\n"
    )
    log = parse_server_log(text, source="twice.log")
    assert log.ranks[0].kv_gib == 6.76
    assert len(log.conflicts) == 1 and "twice.log" in log.conflicts[0] and "TP0" in log.conflicts[0]


def test_unknown_variable_warning_marks_an_unpatched_image():
    text = ("(APIServer pid=1) WARNING 11-29 14:00:00 [interface.py:1470] Unknown vLLM environment "
            "variable detected: VLLM_PCAI_DSPARK_SKIP_MTP_BUFFER\n")
    log = parse_server_log(text, source="x")
    assert log.unknown_flag
    assert log.ranks == ()   # no MiB figure, so no omission


def test_unreadable_log_is_bad_input(tmp_path: Path):
    with pytest.raises(BadInput, match="absent.log"):
        read_server_log(tmp_path / "absent.log")


# --- the real message formats, rendered from the real sources -------------------------------
_MESSAGES = {
    # relative path -> format strings that must exist there verbatim (after joining literals)
    "vllm/v1/worker/gpu_worker.py": ["Available KV cache memory: %s GiB"],
    "vllm/v1/core/kv_cache_utils.py": [
        "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
    ],
    "vllm/v1/worker/gpu_model_runner.py": [
        "Estimated CUDA graph memory: %.2f GiB total",
        "Graph capturing finished in %.0f secs, took %.2f GiB",
    ],
}


def _joined_literals(source: str) -> str:
    """Python source with adjacent string literals joined, so split format strings match."""
    return re.sub(r'"\s*\n\s*"', "", source)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.30.0", "0.31.0", "0.33.0"])
def test_real_vllm_formats_render_into_lines_we_parse(version: str):
    root = vllm.python_sources(version)
    for rel, formats in _MESSAGES.items():
        text = _joined_literals((root / rel).read_text())
        for fmt in formats:
            assert fmt in text, f"{version} {rel}: {fmt!r} not found"
    prefix = "(Worker_TP1 pid=312) INFO 11-29 14:04:09 [gpu_worker.py:773] "
    engine = "(EngineCore pid=245) INFO 11-29 14:04:10 [kv_cache_utils.py:1148] "
    lines = [
        prefix + "Available KV cache memory: %s GiB" % (round(7_400_000_000 / 2**30, 2),),
        engine + "%s KV cache size: %s tokens, Maximum concurrency for %s tokens per request: %.2fx"
        % ("GPU", f"{1150350:,}", f"{131072:,}", 8.7764),
        prefix + "Estimated CUDA graph memory: %.2f GiB total" % (0.92,),
        prefix + "Graph capturing finished in %.0f secs, took %.2f GiB" % (19.4, 0.61),
    ]
    log = parse_server_log("\n".join(lines), source=version)
    assert log.ranks[0].rank == "TP1"
    assert log.ranks[0].kv_gib == 6.89
    assert log.ranks[0].graph_estimate_gib == 0.92
    assert log.ranks[0].graph_capture_gib == 0.61
    assert log.engines[0].tokens == 1_150_350


def test_the_patch_own_omission_line_is_read():
    """Render the logger.info call of the patch set's diff; the parser must read its MiB."""
    patch = (Path(__file__).parents[1] / "patches" / "dspark-skip-mtp-buffer" / "vllm-0.33.0.patch").read_text()
    added = "\n".join(line[1:] for line in patch.splitlines() if line.startswith("+"))
    call = re.search(r"logger\.info\(\s*((?:\"[^\"]*\"\s*)+),", added)
    assert call is not None, "the patch no longer logs the omission with logger.info"
    fmt = "".join(re.findall(r'"([^"]*)"', call.group(1)))
    message = fmt % (4096, 16384, "torch.bfloat16", 4096 * 16384 * 2 / 2**20)
    log = parse_server_log("(Worker_TP0 pid=311) INFO 11-29 14:00:41 [model.py:946] " + message, source="p")
    assert [(r.rank, r.omitted_mib) for r in log.ranks] == [("TP0", 128.0)]
