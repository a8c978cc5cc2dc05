"""The review file a port writes with its variant (Markdown): what a person must read before
marking the variant reviewed (docs/porting.md says how to read it)."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..report.model import CensusEntry, ProbeReport


@dataclass(frozen=True, kw_only=True)
class ReviewInput:
    patch: str
    source_variant: str
    source_releases: tuple[str, ...]
    new_variant: str
    release: str
    source_diff: bytes
    new_diff: bytes
    offsets: Sequence[str]                      # "path: hunk #N offset +K" for files that landed
    resolved: Sequence[str]                     # files a person resolved by hand
    source_census: tuple[CensusEntry, ...] | None   # None: not recorded for the source release
    target_census: tuple[CensusEntry, ...]
    probe: ProbeReport


def render(r: ReviewInput) -> str:
    src = ", ".join(r.source_releases)
    lines = [
        f"# Review: {r.patch} {r.new_variant} (ported from {r.source_variant})",
        "",
        f"`dspark-patch port` carried variant `{r.source_variant}` (vLLM {src}) to vLLM {r.release}. "
        "The variant is **unreviewed** until a person has read this file and set "
        f"`review = \"reviewed\"` on `{r.new_variant}` in patch.toml (see docs/porting.md).",
        "",
        "## What landed and what was resolved by hand",
        "",
    ]
    lines += [f"- landed exactly: {o}" for o in r.offsets] or ["- no file landed without a hand resolution"]
    lines += [f"- resolved by hand: `{p}`: read its part of the interdiff line by line" for p in r.resolved]
    lines += ["", "## Probe verdict on the target with the candidate applied", ""]
    lines.append("**passed**: every case" if r.probe.ok else f"**failed**: {r.probe.detail}")
    lines += ["", "| case | result | detail |", "|---|---|---|"]
    lines += [f"| {_cell(c.name)} | {'ok' if c.ok else '**FAIL**'} | {_cell(c.detail)} |" for c in r.probe.cases]
    lines += ["", f"## The probe's census: vLLM {src} and vLLM {r.release} side by side", ""]
    if r.target_census or r.source_census:
        lines += _census_table(r.source_census, r.target_census, src, r.release)
    else:
        lines.append("This patch set's probe reports no census.")
    lines += ["", f"## Interdiff: {r.source_variant} -> {r.new_variant}", "",
              "The diff of the two diffs: hunks whose changed lines differ are what the port (or the hand "
              "resolution) changed; context and line numbers differ because the releases do.", "",
              "```diff", _interdiff(r.source_diff, r.new_diff, r.source_variant, r.new_variant).rstrip("\n"), "```", ""]
    return "\n".join(lines)


def _census_table(source: tuple[CensusEntry, ...] | None, target: tuple[CensusEntry, ...],
                  src: str, dst: str) -> list[str]:
    def key(e: CensusEntry) -> tuple[str, str, str]:
        return (e.function, e.symbol, e.kind)

    def show(entries: list[CensusEntry]) -> str:
        return "<br>".join(f"`{e.file}:{e.line}` {_cell(e.verdict)}" for e in entries) or "—"

    by_source: dict[tuple[str, str, str], list[CensusEntry]] = {}
    by_target: dict[tuple[str, str, str], list[CensusEntry]] = {}
    for e in source or ():
        by_source.setdefault(key(e), []).append(e)
    for e in target:
        by_target.setdefault(key(e), []).append(e)
    out = []
    if source is None:
        out += [f"(no census recorded for vLLM {src} in the patch set: only vLLM {dst} is shown)", ""]
    out += [f"| function | symbol, kind | vLLM {src} | vLLM {dst} |", "|---|---|---|---|"]
    reached_first = sorted(set(by_source) | set(by_target),
                           key=lambda k: (not any(e.reached for e in by_source.get(k, []) + by_target.get(k, [])), k))
    for k in reached_first:
        out.append(f"| `{_cell(k[0])}` | {_cell(k[1])}, {_cell(k[2])} | {show(by_source.get(k, []))} | {show(by_target.get(k, []))} |")
    return out


def _interdiff(old: bytes, new: bytes, old_name: str, new_name: str) -> str:
    with tempfile.TemporaryDirectory(prefix="dspark-port-review-") as tmp:
        a, b = Path(tmp) / "a", Path(tmp) / "b"
        a.write_bytes(old)
        b.write_bytes(new)
        done = subprocess.run(["diff", "-u", "--label", f"{old_name}.patch", "--label", f"{new_name}.patch", str(a), str(b)],
                              capture_output=True, timeout=120)
    return done.stdout.decode("utf-8", "replace").replace("```", "`\u200b``")


def _cell(text: str) -> str:
    return " ".join(text.replace("|", "\\|").split())
