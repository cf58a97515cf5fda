"""backend.tools.modelgen's other architectures (model_archs.py): each tiny shape is the architecture it names, loads
into HF transformers with every weight the checkpoint holds and none missing, and is the same bytes every time."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from backend.tools import modelgen

ARCHS = {"tiny-llama": "LlamaForCausalLM", "tiny-deepseek-v3": "DeepseekV3ForCausalLM",
         "tiny-glm4-moe": "Glm4MoeForCausalLM", "tiny-minimax-m2": "MiniMaxM2ForCausalLM",
         "tiny-gpt-oss": "GptOssForCausalLM"}


@pytest.mark.parametrize("shape", list(ARCHS))
def test_arch_shape_loads_whole_into_transformers(shape: str, tmp_path: Path) -> None:
    out = modelgen.generate_model(tmp_path / shape, shape)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [ARCHS[shape]]
    assert config["vocab_size"] == len(AutoTokenizer.from_pretrained(out)) == modelgen.VOCAB_SIZE
    assert config["max_position_embeddings"] == 4096
    model, info = AutoModelForCausalLM.from_pretrained(out, dtype=torch.bfloat16, output_loading_info=True)
    assert type(model).__name__ == ARCHS[shape]
    assert not any(info.values()), info  # no missing, unexpected or mismatched weights
    logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert logits.shape == (1, 4, modelgen.VOCAB_SIZE) and torch.isfinite(logits).all()


@pytest.mark.parametrize("shape", list(ARCHS))
def test_arch_shape_is_byte_identical_across_runs(shape: str, tmp_path: Path) -> None:
    def digests(d: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}

    assert digests(modelgen.generate_model(tmp_path / "a", shape)) == digests(modelgen.generate_model(tmp_path / "b",
                                                                                                         shape))


def test_arch_shapes_refuse_fp8_and_layer_counts() -> None:
    with pytest.raises(ValueError, match="--quant applies only to the Qwen3 shapes"):
        modelgen.resolve("tiny-glm4-moe", quant="fp8")
    with pytest.raises(ValueError, match="--num-layers applies only to"):
        modelgen.resolve("tiny-llama", num_layers=2)
