"""On-disk caches that outlive one run. `scans`: layer scans by the layer's uncompressed digest."""

from .scans import ScanCache, default_root

__all__ = ["ScanCache", "default_root"]
