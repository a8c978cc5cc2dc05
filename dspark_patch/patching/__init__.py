"""The pure patch engine: parse a diff, place hunks at zero fuzz, plan every file's new content."""

from dspark_patch.patching.diff import Diff, FileAction, FilePatch, Hunk, HunkLine, LineKind, parse_diff
from dspark_patch.patching.place import Placement, apply_hunks, place_hunks, split_lines
from dspark_patch.patching.plan import FilePlan, PatchPlan, PlanStatus, plan_patch

__all__ = [
    "Diff",
    "FileAction",
    "FilePatch",
    "FilePlan",
    "Hunk",
    "HunkLine",
    "LineKind",
    "PatchPlan",
    "Placement",
    "PlanStatus",
    "apply_hunks",
    "parse_diff",
    "place_hunks",
    "plan_patch",
    "split_lines",
]
