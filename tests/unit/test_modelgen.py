"""Unit tests for backend.tools.modelgen: determinism, tokenizer contract, HF loadability, ensure_model."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Qwen2TokenizerFast

from backend.tools import modelgen

# sha256 of model.safetensors for shape "tiny", seed 0. A change here means every deployed model
# changes too: bump GENERATOR_VERSION and tell whoever pins PoC golden values.
TINY_SEED0_SAFETENSORS_SHA256 = "0afe2e976d73523266c27eae8921e97ec7b4d5b3b73e5907ee8da299dc5a09bb"


def _digests(model_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir())}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return modelgen.generate_model(tmp_path_factory.mktemp("gen") / "tiny", "tiny", 0)


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path):
    return AutoTokenizer.from_pretrained(tiny_dir)


def test_generate_model_is_byte_identical_across_runs(tiny_dir: Path, tmp_path: Path) -> None:
    again = modelgen.generate_model(tmp_path / "again", "tiny", 0)
    assert _digests(again) == _digests(tiny_dir)
    assert set(_digests(again)) == {"config.json", "generation_config.json", "model.safetensors",
                                    "tokenizer.json", "tokenizer_config.json", modelgen.MANIFEST_NAME}


def test_generate_model_matches_golden_weights(tiny_dir: Path) -> None:
    assert _digests(tiny_dir)["model.safetensors"] == TINY_SEED0_SAFETENSORS_SHA256


def test_generate_model_seed_changes_weights_only(tiny_dir: Path, tmp_path: Path) -> None:
    other = _digests(modelgen.generate_model(tmp_path / "seed1", "tiny", 1))
    ours = _digests(tiny_dir)
    assert other["model.safetensors"] != ours["model.safetensors"]
    assert other["tokenizer.json"] == ours["tokenizer.json"]


def test_tokenizer_vocab_matches_config_and_every_id_decodes(tiny_dir: Path, tokenizer) -> None:
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["vocab_size"] == len(tokenizer) == modelgen.VOCAB_SIZE
    assert modelgen.VOCAB_SIZE % 64 == 0
    for token_id in range(config["vocab_size"]):
        assert isinstance(tokenizer.decode([token_id]), str)
        assert tokenizer.convert_ids_to_tokens(token_id) is not None
    assert tokenizer.decode([len(tokenizer) - 1]).startswith("<|reserved_special_token_")


def test_tokenizer_round_trips_and_merges_common_words(tokenizer) -> None:
    text = "Hello world, the answer to the question is 42.\n\nnaïve café 日本 <|im_end|>"
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text
    assert len(ids) < len(text.encode()) // 2
    assert tokenizer.tokenize(" the") == ["Ġthe"]
    assert tokenizer.convert_tokens_to_ids("<|im_end|>") in ids


def test_tokenizer_matches_transformers_qwen2_pipeline(tiny_dir: Path, tokenizer) -> None:
    # transformers v5's Qwen2 class rebuilds the pipeline in code; ours must agree with it.
    qwen2 = Qwen2TokenizerFast.from_pretrained(tiny_dir)
    text = "It's 2024!  Tabs\tand\r\nnewlines, don't   you think? 你好"
    assert qwen2(text)["input_ids"] == tokenizer(text)["input_ids"]


def test_chat_template_renders_chatml(tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                      "<|im_start|>assistant\n")
    no_prompt = tokenizer.apply_chat_template(messages, tokenize=False)
    assert no_prompt.endswith("Hi<|im_end|>\n")


def test_eos_is_im_end(tiny_dir: Path, tokenizer) -> None:
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    endoftext = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == im_end
    assert tokenizer.pad_token_id == endoftext
    assert json.loads((tiny_dir / "config.json").read_text())["eos_token_id"] == im_end
    generation = json.loads((tiny_dir / "generation_config.json").read_text())
    assert generation["eos_token_id"] == [im_end, endoftext]
    assert not {"temperature", "top_p", "top_k"} & set(generation)


def test_transformers_loads_weights_and_forward_is_finite(tiny_dir: Path, tokenizer) -> None:
    model, info = AutoModelForCausalLM.from_pretrained(tiny_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"] and not info["error_msgs"]
    assert model.dtype == torch.bfloat16 and type(model).__name__ == "Qwen3ForCausalLM"
    ids = torch.tensor([tokenizer("the quick brown fox")["input_ids"]])
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], modelgen.VOCAB_SIZE)
    assert torch.isfinite(logits).all()
    assert torch.equal(model.model.norm.weight, torch.ones_like(model.model.norm.weight))
    assert abs(model.lm_head.weight.float().std().item() - modelgen.INIT_STD) < 1e-3


def _hf_state_dict_shapes(config_json: dict, tmp_path: Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the HF module's state dict, built on meta (no memory, no weights)."""
    (tmp_path / "config.json").write_text(json.dumps(config_json))
    config = AutoConfig.from_pretrained(tmp_path)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def _fold_experts(specs: dict[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Per-expert checkpoint names -> transformers v5's fused experts.gate_up_proj / experts.down_proj."""
    folded: dict[str, tuple[int, ...]] = {}
    experts: dict[str, dict[str, list[tuple[int, ...]]]] = {}
    for name, shape in specs.items():
        match = re.fullmatch(r"(.*\.mlp\.experts)\.\d+\.(gate|up|down)_proj\.weight", name)
        if match is None:
            folded[name] = shape
        else:
            experts.setdefault(match[1], {}).setdefault(match[2], []).append(shape)
    for prefix, parts in experts.items():
        (inter, hidden), num_experts = parts["gate"][0], len(parts["gate"])
        assert parts["up"] == parts["gate"] and len(parts["down"]) == num_experts
        assert set(parts["down"]) == {(hidden, inter)}
        folded[f"{prefix}.gate_up_proj"] = (num_experts, 2 * inter, hidden)
        folded[f"{prefix}.down_proj"] = (num_experts, hidden, inter)
    return dict(sorted(folded.items()))


@pytest.mark.parametrize(("shape", "num_layers"),
                         [("tiny", None), ("qwen3-0.6b", None), ("tiny-moe", None), ("qwen3-235b-a22b", 2)])
def test_tensor_specs_match_hf_state_dict(tmp_path: Path, shape: str, num_layers: int | None) -> None:
    # Checks the large shapes' names and shapes without writing GBs: the HF module is built on meta.
    config_json = modelgen.json_files(shape, num_layers)["config.json"]
    expected = _hf_state_dict_shapes(config_json, tmp_path)
    assert _fold_experts(modelgen.tensor_specs(shape, num_layers)) == dict(sorted(expected.items()))


def test_weights_are_the_same_whatever_the_draw_chunk() -> None:
    # Large tensors are drawn in chunks to bound memory; the bytes must not depend on the chunk size.
    whole = modelgen.bf16_weight_bits("model.layers.0.mlp.up_proj.weight", (97, 1031), 0, chunk=1 << 30)
    for chunk in (1, 1000, 4096, 97 * 1031 - 1):
        assert np.array_equal(modelgen.bf16_weight_bits("model.layers.0.mlp.up_proj.weight", (97, 1031), 0,
                                                        chunk=chunk), whole), chunk


def test_float32_to_bf16_bits_matches_torch() -> None:
    values = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 0.02
    edge = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 3.3e38, 1e-40], dtype=np.float32)
    values = np.concatenate([values, edge])
    ours = modelgen.float32_to_bf16_bits(values)
    theirs = torch.from_numpy(values).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(ours, theirs)


def test_ensure_model_keeps_complete_dir(tmp_path: Path) -> None:
    out = modelgen.generate_model(tmp_path / "m", "tiny", 0)
    inode = (out / "model.safetensors").stat().st_ino
    assert modelgen.ensure_model(out, "tiny", 0) == out
    assert (out / "model.safetensors").stat().st_ino == inode


@pytest.mark.parametrize("damage", ["delete_file", "truncate_weights", "no_manifest", "other_seed"])
def test_ensure_model_regenerates_incomplete_dir(tmp_path: Path, damage: str) -> None:
    out = modelgen.generate_model(tmp_path / "m", "tiny", 0)
    expected = _digests(out)
    seed = 0
    if damage == "delete_file":
        (out / "tokenizer.json").unlink()
    elif damage == "truncate_weights":
        with open(out / "model.safetensors", "r+b") as f:
            f.truncate(1000)
    elif damage == "no_manifest":
        (out / modelgen.MANIFEST_NAME).unlink()
    else:
        seed = 1
    assert not modelgen.is_model_complete(out, "tiny", seed)
    modelgen.ensure_model(out, "tiny", seed)
    assert modelgen.is_model_complete(out, "tiny", seed)
    if seed == 0:
        assert _digests(out) == expected
    assert [p.name for p in tmp_path.iterdir()] == ["m"], "temp dirs must be cleaned up"


def test_main_cli_prints_only_the_model_path(tmp_path: Path) -> None:
    # A subprocess, so the CLI's logging set-up does not leak into other tests.
    cmd = [sys.executable, "-m", "backend.tools.modelgen", "--out", str(tmp_path / "cli"), "--seed", "0"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert result.stdout == f"{(tmp_path / 'cli').resolve()}\n"
    assert _digests(tmp_path / "cli")["model.safetensors"] == TINY_SEED0_SAFETENSORS_SHA256


@pytest.mark.parametrize(("shape", "kw", "match"), [
    ("qwen3-72b", {}, "unknown shape"), ("tiny", {"num_layers": 2}, "applies only to"),
    ("tiny-moe", {"quant": "int4"}, "unknown quantization"), ("qwen3-235b-a22b", {}, "needs --num-layers")])
def test_generate_model_rejects_unknown_options(tmp_path: Path, shape: str, kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        modelgen.generate_model(tmp_path / "x", shape, 0, **kw)
    assert not list(tmp_path.iterdir())


@settings(max_examples=200, deadline=None)
@given(text=st.text(min_size=1, max_size=200))
def test_token_byte_bound_holds_for_any_text(tokenizer, text) -> None:
    """The prompt size pre-check (backend/processor/params.py) may only refuse text that cannot fit."""
    pytest.importorskip("vllm")
    from backend.processor.params import max_token_bytes
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert len(text.encode("utf-8", "surrogatepass")) <= max(1, len(ids)) * max_token_bytes(tokenizer)


def test_config_only_writes_the_json_files_and_never_passes_for_a_whole_model(tmp_path):
    from backend.tools.modelgen import is_model_complete, json_files, write_config_only

    out = write_config_only(tmp_path / "m", "qwen3-235b-a22b", num_layers=94, quant="fp8")
    assert sorted(p.name for p in out.iterdir()) == sorted(json_files("qwen3-235b-a22b", 94, "fp8"))
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 94
    # No manifest: ensure_model would write the weights into it rather than serve it as whole.
    assert not is_model_complete(out, "qwen3-235b-a22b", 0, num_layers=94, quant="fp8")
