"""dspark-patch: apply a reviewed patch to the vLLM inside an image, exactly and verifiably."""

__version__ = "0.1.0"
