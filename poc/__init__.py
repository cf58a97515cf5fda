"""PoC v2 math: seeds, RNG, transforms, artifacts, validation and nonce ranges (pure torch/numpy, no vLLM)."""
