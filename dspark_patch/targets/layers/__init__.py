"""The one strict layer reader: every route that reads image layers goes through it.

`tarstream` parses tar headers strictly (what Go's archive/tar and Python's tarfile read alike),
`scan` reads one layer keeping only what a predicate asks for, `merge` stacks scans the way the
engine unpacks them and looks paths up as a chroot would. Rules: docs/status.md, "The layer reader".
"""

from .merge import LayerView, merge
from .new_layer import TakenLayer
from .read import LayersRead
from .scan import Entry, LayerScan, Retain, RetainPredicate, scan_layer
from .tarstream import Limits, Member, TarStream

__all__ = ["Entry", "LayerScan", "LayersRead", "LayerView", "Limits", "Member", "Retain", "RetainPredicate", "TakenLayer", "TarStream", "merge",
           "scan_layer"]
