"""An independent PoC v2 reference: HF transformers Qwen3 with the same seeded weights and reflections."""

from __future__ import annotations

from pathlib import Path

import torch

from poc.artifacts import compute_artifacts
from poc.rng import householder_vectors, input_embeddings
from poc.transforms import reflect


def _hook(vector: torch.Tensor):
    def hook(_module, _inputs, output):
        if isinstance(output, tuple):
            return (reflect(output[0], vector), *output[1:])
        return reflect(output, vector)  # an HF layer's output is the whole residual stream
    return hook


class HFReference:
    def __init__(self, model_dir: Path) -> None:
        from transformers import AutoModelForCausalLM
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
        self.hidden_size = self.model.config.hidden_size

    @torch.inference_mode()
    def artifacts(self, block_hash: str, public_key: str, nonces: list[int], seq_len: int, k_dim: int = 12,
                  stronger_rng: bool = False) -> dict[int, str]:
        layers = self.model.model.layers
        vectors = householder_vectors(block_hash, len(layers), self.hidden_size, "cpu")
        handles = [layer.register_forward_hook(_hook(v)) for layer, v in zip(layers, vectors, strict=False)]
        try:
            x = input_embeddings(block_hash, public_key, nonces, seq_len, self.hidden_size, "cpu", torch.bfloat16,
                                 stronger_rng=stronger_rng)
            out = self.model.model(inputs_embeds=x).last_hidden_state[:, -1].float()
        finally:
            for h in handles:
                h.remove()
        return dict(compute_artifacts(out, block_hash, public_key, nonces, k_dim))
