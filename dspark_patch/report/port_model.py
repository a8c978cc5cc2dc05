"""What a `dspark-patch port` call did: a frozen record the CLI renders (one line per finding)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .model import CensusEntry, ErrorReport, ProbeReport

# covered: a member of a series that already has a variant for the release (used as it is)
PortStatus = Literal["written", "covered", "conflict", "refused", "failed"]
PortFileStatus = Literal["landed", "conflict", "resolved"]


@dataclass(frozen=True, kw_only=True)
class PortFileReport:
    path: str
    status: PortFileStatus
    offsets: tuple[int, ...] = ()       # landed: each hunk's offset in the target file
    conflicts: tuple[str, ...] = ()     # one line per hunk that did not land exactly
    work_file: str = ""


@dataclass(frozen=True, kw_only=True)
class PortReport:
    status: PortStatus
    exit_code: int
    patch: str | None
    source_variant: str | None
    release: str
    work: str
    files: tuple[PortFileReport, ...] = ()
    # Readers of the buffer on the DSpark V2 path with no None check, in the pristine target.
    unguarded: tuple[CensusEntry, ...] = ()
    probe: ProbeReport | None = None    # on the target with the candidate applied
    variant: str | None = None          # the variant written into the patch set
    diff_path: str | None = None
    review_path: str | None = None
    error: ErrorReport | None = None
    notes: tuple[str, ...] = ()
    # Hunks conflict, yet the patch set's effect cases pass on the pristine release: it appears to
    # ship the change. Where it decides, what the probe sees differ, and the candidate record.
    ships_change: tuple[str, ...] = ()          # "path:function" entries
    behaviour: tuple[str, ...] = ()             # one line per difference the probe can see
    superseded_candidate: str | None = None     # the unreviewed [[superseded]] table written
