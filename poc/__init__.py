"""PoC v2 math: seeds, RNG, transforms, artifacts, validation, nonce ranges, the job spec and the mining round
(torch, numpy, scipy and Triton; no vLLM, nothing from backend/). The forward inside vLLM's workers is
backend/engine/pocworker/."""
