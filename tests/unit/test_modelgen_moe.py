"""Unit tests for backend.tools.modelgen's Qwen3-MoE shapes (tiny-moe, qwen3-235b-a22b) and FP8 checkpoints."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM

from backend.tools import modelgen, safetensors_stream

# sha256 of model.safetensors for tiny-moe, seed 0, in bf16 and with --quant fp8. As for the dense tiny
# (test_modelgen.py): a change means every deployed model changes: bump GENERATOR_VERSION.
TINY_MOE_SEED0_SAFETENSORS_SHA256 = "7e7c94b3db07abd53bb364adab1846ea8cf0980a0b740ddd728b710e2786cff7"
TINY_MOE_FP8_SEED0_SAFETENSORS_SHA256 = "70227cad0cb4113798b654dc2c553b780063fd674b6853362b5af7a8180aeca3"
# The dense tiny's JSON files, pinned when the MoE shapes were added: the refactor kept them byte for byte.
TINY_JSON_SHA256 = {"config.json": "66b4f072a41454186edf65bbeada54b7f392432ce9bcda8f33496e862a6da1f6",
                    "tokenizer.json": "f062eef132d30fdc2a4e0a8fc76b5f4a03ae43d857d141cb6336a7c7e11a758b",
                    "tokenizer_config.json": "ea75e22acb1308d96616e324142a03734e627fc91dbbbd378a1d998cbf11a67d"}


def _digests(model_dir: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model_dir.iterdir())}


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return modelgen.generate_model(tmp_path_factory.mktemp("gen") / "tiny", "tiny", 0)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return modelgen.generate_model(tmp_path_factory.mktemp("gen") / "tiny-moe", "tiny-moe", 0)


@pytest.fixture(scope="module")
def moe_fp8_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return modelgen.generate_model(tmp_path_factory.mktemp("gen") / "tiny-moe-fp8", "tiny-moe", 0, quant="fp8")


def test_generate_model_keeps_dense_json_files(tiny_dir: Path) -> None:
    digests = _digests(tiny_dir)
    assert {name: digests[name] for name in TINY_JSON_SHA256} == TINY_JSON_SHA256


@pytest.mark.parametrize("quant", [None, "fp8"])
def test_generate_tiny_moe_is_byte_identical_and_matches_golden(moe_dir: Path, moe_fp8_dir: Path, tmp_path: Path,
                                                                quant: str | None) -> None:
    again = _digests(modelgen.generate_model(tmp_path / "again", "tiny-moe", 0, quant=quant))
    assert again == _digests(moe_fp8_dir if quant else moe_dir)
    golden = TINY_MOE_FP8_SEED0_SAFETENSORS_SHA256 if quant else TINY_MOE_SEED0_SAFETENSORS_SHA256
    assert again["model.safetensors"] == golden


def test_transformers_loads_tiny_moe_with_the_dense_tiny_dims(moe_dir: Path, tiny_dir: Path) -> None:
    model, info = AutoModelForCausalLM.from_pretrained(moe_dir, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    assert not info["mismatched_keys"] and not info["error_msgs"]
    assert type(model).__name__ == "Qwen3MoeForCausalLM" and model.dtype == torch.bfloat16
    config, dense = model.config, json.loads((tiny_dir / "config.json").read_text())
    assert config.model_type == "qwen3_moe"
    assert (config.num_experts, config.num_experts_per_tok, config.norm_topk_prob) == (8, 2, True)
    assert (config.num_hidden_layers, config.decoder_sparse_step, config.mlp_only_layers) == (4, 1, [])
    for key in ("vocab_size", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim"):
        assert getattr(config, key) == dense[key], key
    digests, dense_digests = _digests(moe_dir), _digests(tiny_dir)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert digests[name] == dense_digests[name], name
    # HF fuses the experts on load: expert 3's gate and up rows are our two tensors, in that order.
    with safe_open(moe_dir / "model.safetensors", "pt") as f:
        gate = f.get_tensor("model.layers.1.mlp.experts.3.gate_proj.weight")
        up = f.get_tensor("model.layers.1.mlp.experts.3.up_proj.weight")
        router = f.get_tensor("model.layers.1.mlp.gate.weight")
    mlp = model.model.layers[1].mlp
    assert torch.equal(mlp.experts.gate_up_proj[3], torch.cat([gate, up]))
    assert torch.equal(mlp.gate.weight, router)
    assert abs(router.float().std().item() - modelgen.INIT_STD) < 2e-3
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 300, 400]])).logits
    assert logits.shape == (1, 5, modelgen.VOCAB_SIZE) and torch.isfinite(logits).all()


def test_fp8_checkpoint_layout_and_dequantized_values(moe_fp8_dir: Path, moe_dir: Path) -> None:
    config = json.loads((moe_fp8_dir / "config.json").read_text())
    quant = config["quantization_config"]
    assert {k: quant[k] for k in ("quant_method", "activation_scheme", "fmt", "weight_block_size")} == {
        "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": [128, 128]}
    assert {"lm_head", "model.layers.0.mlp.gate", "model.layers.3.mlp.gate"} <= set(quant["modules_to_not_convert"])
    assert {k: v for k, v in config.items() if k != "quantization_config"} == json.loads(
        (moe_dir / "config.json").read_text())
    with safe_open(moe_fp8_dir / "model.safetensors", "pt") as fp8, safe_open(moe_dir / "model.safetensors",
                                                                              "pt") as bf16:
        names = set(fp8.keys())
        assert {n for n in names if not n.endswith("_scale_inv")} == set(bf16.keys())
        for name in bf16.keys():  # noqa: SIM118  (safe_open is not a mapping)
            reference, stored = bf16.get_tensor(name), fp8.get_tensor(name)
            if not name.endswith("_proj.weight"):  # router, norms, embeddings, lm_head: untouched bf16
                assert stored.dtype == torch.bfloat16 and torch.equal(stored, reference), name
                assert name + "_scale_inv" not in names
                continue
            scale = fp8.get_tensor(name + "_scale_inv")
            out_dim, in_dim = reference.shape
            assert stored.dtype == torch.float8_e4m3fn and stored.shape == reference.shape, name
            assert scale.dtype == torch.bfloat16 and scale.shape == (-(-out_dim // 128), -(-in_dim // 128)), name
            # torch's own float8 decoding: an independent check of the hand-rolled encoder.
            dequantized = stored.float() * scale.float().repeat_interleave(128, 0).repeat_interleave(128, 1)[
                :out_dim, :in_dim]
            # e4m3 keeps 3 mantissa bits: half an ulp is 1/16 of the value; the block's largest value is
            # at most 448 x scale, and subnormals step by scale / 512.
            error = (dequantized - reference.float()).abs()
            assert (error <= reference.float().abs() / 16 + scale.float().max() / 1024).all(), name
            assert (error.max() / reference.float().abs().max()).item() < 0.07, name


@pytest.mark.parametrize("quant", [None, "fp8"])
def test_qwen3_235b_layer_shapes_from_headers_only(quant: str | None) -> None:
    """The 235B shape with one layer, checked from the planned safetensors headers: nothing is written."""
    stored = modelgen.stored_tensors("qwen3-235b-a22b", 1, quant)
    shards = safetensors_stream.plan_shards(stored)
    headers = {}
    for names in shards:
        raw = safetensors_stream.header_bytes(names, stored)
        (length,) = struct.unpack("<Q", raw[:8])
        assert len(raw) == 8 + length and length % 8 == 0
        header = json.loads(raw[8:])
        assert header.pop("__metadata__") == {"format": "pt"}
        size = sum(e["data_offsets"][1] - e["data_offsets"][0] for e in header.values())
        assert size <= safetensors_stream.MAX_SHARD_BYTES
        headers.update(header)
    assert len(shards) > 1 and list(headers) == list(stored)

    def entry(name: str) -> tuple[str, tuple[int, ...]]:
        return headers[name]["dtype"], tuple(headers[name]["shape"])

    linear = "F8_E4M3" if quant else "BF16"
    assert entry("model.embed_tokens.weight") == entry("lm_head.weight") == ("BF16", (151936, 4096))
    layer = "model.layers.0."
    assert entry(layer + "self_attn.q_proj.weight") == (linear, (64 * 128, 4096))
    assert entry(layer + "self_attn.k_proj.weight") == entry(layer + "self_attn.v_proj.weight") == (
        linear, (4 * 128, 4096))
    assert entry(layer + "self_attn.o_proj.weight") == (linear, (4096, 64 * 128))
    assert entry(layer + "self_attn.q_norm.weight") == ("BF16", (128,))
    assert entry(layer + "mlp.gate.weight") == ("BF16", (128, 4096))
    for e in (0, 127):
        assert entry(f"{layer}mlp.experts.{e}.gate_proj.weight") == (linear, (1536, 4096))
        assert entry(f"{layer}mlp.experts.{e}.down_proj.weight") == (linear, (4096, 1536))
    assert "model.layers.0.mlp.experts.128.up_proj.weight" not in headers
    assert not any(n.startswith("model.layers.1.") for n in headers)
    if quant:
        assert entry(f"{layer}mlp.experts.5.up_proj.weight_scale_inv") == ("BF16", (12, 32))
        assert entry(f"{layer}mlp.experts.5.down_proj.weight_scale_inv") == ("BF16", (32, 12))
        assert entry(layer + "self_attn.k_proj.weight_scale_inv") == ("BF16", (4, 32))
        assert "model.layers.0.mlp.gate.weight_scale_inv" not in headers


def test_qwen3_235b_config_and_tokenizer_fill_the_vocabulary(tmp_path: Path) -> None:
    files = modelgen.json_files("qwen3-235b-a22b", 3)
    config = files["config.json"]
    assert (config["hidden_size"], config["intermediate_size"], config["moe_intermediate_size"]) == (
        4096, 12288, 1536)
    assert (config["num_experts"], config["num_experts_per_tok"], config["num_hidden_layers"]) == (128, 8, 3)
    assert (config["vocab_size"], config["max_position_embeddings"], config["rope_theta"]) == (
        151936, 262144, 5000000.0)
    tok = files["tokenizer.json"]
    ids = [*tok["model"]["vocab"].values(), *(t["id"] for t in tok["added_tokens"])]
    assert sorted(ids) == list(range(151936))
    assert tok["added_tokens"][:3] == modelgen.json_files("tiny")["tokenizer.json"]["added_tokens"][:3]
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert AutoConfig.from_pretrained(tmp_path).num_experts == 128


def test_fp8_config_is_read_by_vllm_with_routers_and_lm_head_unquantized() -> None:
    """vLLM's own fp8 config parser (no kernels, so no GPU needed): block-quantized linears, bf16 routers."""
    pytest.importorskip("vllm")
    from vllm.model_executor.layers.quantization.fp8 import Fp8Config
    from vllm.model_executor.layers.quantization.utils.quant_utils import is_layer_skipped
    config = Fp8Config.from_config(modelgen.json_files("tiny-moe", quant="fp8")["config.json"]["quantization_config"])
    assert config.is_checkpoint_fp8_serialized and config.weight_block_size == [128, 128]
    assert config.activation_scheme == "dynamic"
    fused = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}

    def skipped(prefix: str) -> bool:
        return is_layer_skipped(prefix=prefix, ignored_layers=config.ignored_layers, fused_mapping=fused,
                                match_mode=config.ignored_layers_match_mode)

    assert all(skipped(p) for p in ("lm_head", "model.layers.0.mlp.gate", "model.layers.3.mlp.gate"))
    assert not any(skipped(f"model.layers.{i}.{m}") for i in (0, 3)
                   for m in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.experts"))


def test_qwen3_235b_expert_tensor_quantizes_to_its_stored_size() -> None:
    name = "model.layers.0.mlp.experts.7.down_proj.weight"
    stored = modelgen.stored_tensors("qwen3-235b-a22b", 1, "fp8")
    blobs = modelgen._group_bytes((name, name + "_scale_inv"), (4096, 1536), 0, "fp8")
    assert [len(b) for b in blobs] == [stored[name].num_bytes, stored[name + "_scale_inv"].num_bytes]
    assert [len(b) for b in blobs] == [4096 * 1536, 32 * 12 * 2]


def test_sharded_checkpoint_loads_like_the_single_file(moe_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "sharded"
    out.mkdir()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        (out / name).write_bytes((moe_dir / name).read_bytes())
    specs, stored = modelgen.tensor_specs("tiny-moe"), modelgen.stored_tensors("tiny-moe")
    files = safetensors_stream.write_checkpoint(
        out, stored, [(n,) for n in stored], lambda g: [modelgen.bf16_weight_bits(g[0], specs[g[0]], 0).tobytes()],
        max_shard_bytes=2_000_000)
    assert files[-1] == "model.safetensors.index.json" and len(files) >= 4
    assert files[0] == f"model-00001-of-{len(files) - 1:05d}.safetensors"
    index = json.loads((out / files[-1]).read_text())
    assert set(index["weight_map"]) == set(stored) and set(index["weight_map"].values()) == set(files[:-1])
    assert index["metadata"]["total_size"] == sum(t.num_bytes for t in stored.values())
    assert all((out / f).stat().st_size <= 2_000_000 + 100_000 for f in files[:-1])  # data + header
    sharded = AutoModelForCausalLM.from_pretrained(out).state_dict()
    single = AutoModelForCausalLM.from_pretrained(moe_dir).state_dict()
    assert sharded.keys() == single.keys() and all(torch.equal(sharded[k], single[k]) for k in single)


@pytest.mark.parametrize(("args", "message"), [
    (["--shape", "tiny", "--num-layers", "2"], "--num-layers applies only to qwen3-235b-a22b"),
    (["--shape", "qwen3-235b-a22b"], "needs --num-layers"),
    (["--shape", "qwen3-235b-a22b", "--num-layers", "95"], "--num-layers must be in [1, 94]"),
    (["--shape", "qwen3-72b"], "invalid choice"),
    (["--quant", "int4"], "invalid choice"),
])
def test_main_cli_rejects_bad_combinations_with_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    cmd = [sys.executable, "-m", "backend.tools.modelgen", "--out", str(tmp_path / "m"), *args]
    result = subprocess.run(cmd, capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert message in result.stderr.splitlines()[-1] and "Traceback" not in result.stderr
    assert not (tmp_path / "m").exists()


def test_ensure_model_regenerates_for_other_quant_or_layers(moe_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "m"
    out.mkdir()
    for p in moe_dir.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    assert modelgen.is_model_complete(out, "tiny-moe", 0)
    assert not modelgen.is_model_complete(out, "tiny-moe", 0, quant="fp8")
    assert not modelgen.is_model_complete(out, "qwen3-235b-a22b", 0, num_layers=4)
    modelgen.ensure_model(out, "tiny-moe", 0, quant="fp8")
    manifest = json.loads((out / modelgen.MANIFEST_NAME).read_text())
    assert (manifest["shape"], manifest["num_layers"], manifest["quant"]) == ("tiny-moe", 4, "fp8")
    assert _digests(out)["model.safetensors"] == TINY_MOE_FP8_SEED0_SAFETENSORS_SHA256


def test_is_model_complete_reads_a_manifest_without_layers_or_quant(tiny_dir: Path, tmp_path: Path) -> None:
    # Directories written before --num-layers and --quant existed describe the defaults: no regeneration.
    out = tmp_path / "old"
    out.mkdir()
    for p in tiny_dir.iterdir():
        (out / p.name).write_bytes(p.read_bytes())
    manifest = json.loads((out / modelgen.MANIFEST_NAME).read_text())
    del manifest["num_layers"], manifest["quant"]
    (out / modelgen.MANIFEST_NAME).write_text(json.dumps(manifest))
    assert modelgen.is_model_complete(out, "tiny", 0)
    assert not modelgen.is_model_complete(out, "tiny", 0, quant="fp8")
