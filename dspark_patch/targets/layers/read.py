"""How an image's layers were read by the strict layer reader (targets/docker/layer_check.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class LayersRead:
    """How `check_layers` read an image's layers with the strict layer reader: every scan from
    the scan cache, through one save of the image, or not at all (`not_cached` of `layers` had no
    scan kept and no save was asked for)."""

    how: Literal["cached", "saved", "not-read"]
    layers: int
    not_cached: int = 0
