"""Model generator: owns writing a local, randomly initialised HF Qwen3 (dense or MoE) model directory.

There is no model hub, so every deployment builds its model from (shape, seed, layers, quantization). The
output must be byte-identical on every machine and with any torch/tokenizers version, because PoC artifacts
computed on one host are checked on another. Hence: JSON files are hand-written with fixed key order, the
safetensors files are streamed by hand (safetensors_stream.py: no library layout choices), weights come
from per-tensor PCG64 streams and are rounded to bf16 (and, with --quant fp8, to block FP8: fp8_block.py)
with explicit integer arithmetic.

    python -m backend.tools.modelgen --out DIR [--shape S] [--num-layers N] [--quant fp8] [--seed 0] [--force]

Shapes: tiny and qwen3-0.6b (dense Qwen3), tiny-moe (Qwen3-MoE for CI), qwen3-235b-a22b (the exact
per-layer shapes of Qwen3-235B-A22B-Instruct-2507; --num-layers N of them, for GPU runs); tiny-llama,
tiny-deepseek-v3, tiny-glm4-moe, tiny-minimax-m2, tiny-gpt-oss (the other decoders vLLM serves: model_archs.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import structlog

from backend.tools import fp8_block, model_archs
from backend.tools.model_tokenizer import CHAT_TEMPLATE, VOCAB_SIZE, tokenizer_json
from backend.tools.safetensors_stream import StoredTensor, write_checkpoint
from common.logs import configure_logging

logger = structlog.get_logger(__name__)

# Bump when any model file byte changes; a directory written by another version is regenerated.
GENERATOR_VERSION = 2  # 2: the tiny shapes take a 262144 context (weights unchanged)
MANIFEST_NAME = "pocserve_model.json"
INIT_STD = 0.02
QUANTS = ("fp8",)
CHUNK = 1 << 24  # values drawn at a time (64 MB of float32)


@dataclasses.dataclass(frozen=True)
class Shape:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    vocab_size: int = VOCAB_SIZE
    rope_theta: float = 1000000.0
    num_experts: int = 0  # 0: dense Qwen3ForCausalLM; else Qwen3MoeForCausalLM, every layer sparse
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    is_layer_count_free: bool = False  # --num-layers applies: a slice of a model too large to write whole
    arch: str | None = None  # None: Qwen3 (dense or MoE); else a key of model_archs.ARCHS, which lays it out

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


# The tiny shapes take the real 235B model's context (262144), so that the network's `--max-model-len 240000`
# starts them as it starts the real one (the rotary cache is computed per position: no weight or number changes).
SHAPES: dict[str, Shape] = {
    "tiny": Shape(256, 768, 4, 4, 2, 64, 262144),
    "qwen3-0.6b": Shape(1024, 3072, 28, 16, 8, 128, 40960),
    "tiny-moe": Shape(256, 768, 4, 4, 2, 64, 262144, num_experts=8, num_experts_per_tok=2,
                      moe_intermediate_size=128),
    # Qwen3-235B-A22B-Instruct-2507's config.json; the 2507 release raised rope_theta from 1e6 to 5e6 with
    # the 256K context. 94 layers in full (~470 GB in bf16): --num-layers (required) picks how many.
    "qwen3-235b-a22b": Shape(4096, 12288, 94, 64, 4, 128, 262144, vocab_size=151936, rope_theta=5000000.0,
                             num_experts=128, num_experts_per_tok=8, moe_intermediate_size=1536,
                             is_layer_count_free=True),
    # The other decoders vLLM serves, tiny (model_archs.py), with a modest context.
    "tiny-llama": Shape(256, 768, 4, 4, 2, 64, 4096, rope_theta=500000.0, arch="llama"),
    "tiny-deepseek-v3": Shape(256, 768, 4, 4, 4, 64, 4096, rope_theta=10000.0, num_experts=8, num_experts_per_tok=2,
                              moe_intermediate_size=128, arch="deepseek_v3"),
    "tiny-glm4-moe": Shape(256, 768, 4, 4, 2, 64, 4096, num_experts=8, num_experts_per_tok=2,
                           moe_intermediate_size=128, arch="glm4_moe"),
    "tiny-minimax-m2": Shape(256, 768, 4, 4, 2, 64, 4096, rope_theta=5000000.0, num_experts=8,
                             num_experts_per_tok=2, moe_intermediate_size=128, arch="minimax_m2"),
    "tiny-gpt-oss": Shape(256, 768, 4, 4, 2, 64, 4096, rope_theta=150000.0, num_experts=8, num_experts_per_tok=2,
                          moe_intermediate_size=128, arch="gpt_oss"),
}


def resolve(shape: str, num_layers: int | None = None, quant: str | None = None) -> Shape:
    """The shape with its layer count applied; ValueError (one line) for a combination that does not exist."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}, expected one of {sorted(SHAPES)}")
    if quant is not None and quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}, expected one of {list(QUANTS)}")
    dims = SHAPES[shape]
    if quant is not None and dims.arch is not None:
        raise ValueError(f"--quant applies only to the Qwen3 shapes, not {shape!r}")
    if num_layers is None:
        if dims.is_layer_count_free:
            raise ValueError(f"shape {shape!r} needs --num-layers N, 1 to {dims.num_hidden_layers} (all of them "
                             f"is the full model, hundreds of GB)")
        return dims
    if not dims.is_layer_count_free:
        free = sorted(s for s, d in SHAPES.items() if d.is_layer_count_free)
        raise ValueError(f"--num-layers applies only to {', '.join(free)}; shape {shape!r} has a fixed "
                         f"{dims.num_hidden_layers} layers")
    if not 1 <= num_layers <= dims.num_hidden_layers:
        raise ValueError(f"--num-layers must be in [1, {dims.num_hidden_layers}] for {shape!r}, got {num_layers}")
    return dataclasses.replace(dims, num_hidden_layers=num_layers)


def _config(dims: Shape, ids: dict[str, int], quant: str | None) -> dict:
    config = _qwen3_config(dims) if dims.arch is None else model_archs.config(dims, INIT_STD)
    config.update({"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"]})
    if quant == "fp8":
        # As in Qwen's FP8 releases: the routers and norms are listed, so vLLM keeps mlp.gate a bf16 linear.
        per_layer = ["input_layernorm", *(["mlp.gate"] if dims.is_moe else []), "post_attention_layernorm"]
        config["quantization_config"] = {
            "quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3",
            "weight_block_size": [fp8_block.BLOCK, fp8_block.BLOCK],
            "modules_to_not_convert": ["lm_head", *(f"model.layers.{i}.{m}" for i in range(dims.num_hidden_layers)
                                                    for m in per_layer)]}
    return config


def _qwen3_config(dims: Shape) -> dict:
    shape_keys = {f: getattr(dims, f) for f in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                 "num_attention_heads", "num_key_value_heads", "head_dim",
                                                 "max_position_embeddings")}
    arch, model_type = ("Qwen3MoeForCausalLM", "qwen3_moe") if dims.is_moe else ("Qwen3ForCausalLM", "qwen3")
    config = {
        "architectures": [arch], "model_type": model_type, "torch_dtype": "bfloat16",
        "vocab_size": dims.vocab_size, **shape_keys, "hidden_act": "silu", "attention_bias": False,
        "attention_dropout": 0.0, "initializer_range": INIT_STD, "rms_norm_eps": 1e-6,
        "rope_theta": dims.rope_theta, "rope_scaling": None, "tie_word_embeddings": False,
        "use_cache": True, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": dims.num_hidden_layers,
    }
    if dims.is_moe:
        config.update({"decoder_sparse_step": 1, "mlp_only_layers": [],
                       "moe_intermediate_size": dims.moe_intermediate_size, "num_experts": dims.num_experts,
                       "num_experts_per_tok": dims.num_experts_per_tok, "norm_topk_prob": True,
                       "output_router_logits": False, "router_aux_loss_coef": 0.001})
    return config


def json_files(shape: str, num_layers: int | None = None, quant: str | None = None) -> dict[str, dict]:
    """File name -> content of every JSON file in the model directory."""
    dims = resolve(shape, num_layers, quant)
    tok = tokenizer_json(dims.vocab_size)
    ids = {t["content"]: t["id"] for t in tok["added_tokens"][:3]}
    # PreTrainedTokenizerFast loads tokenizer.json verbatim on transformers v4 and v5; with a
    # Qwen2 class name v5 would rebuild the pipeline in code.
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False,
        "add_eos_token": False, "clean_up_tokenization_spaces": False, "errors": "replace",
        "split_special_tokens": False, "model_max_length": dims.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
    }
    # No sampling defaults: vLLM applies generation_config values as request defaults.
    generation_config = {"bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
                         "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}
    return {"config.json": _config(dims, ids, quant), "generation_config.json": generation_config,
            "tokenizer.json": tok, "tokenizer_config.json": tokenizer_config}


def tensor_specs(shape: str, num_layers: int | None = None) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter as HF checkpoints name them (experts one by one), sorted by name."""
    d = resolve(shape, num_layers)
    if d.arch is not None:
        return model_archs.tensor_specs(d)
    hidden, head_dim = d.hidden_size, d.head_dim
    q_dim, kv_dim = d.num_attention_heads * head_dim, d.num_key_value_heads * head_dim
    specs = {"model.embed_tokens.weight": (d.vocab_size, hidden), "model.norm.weight": (hidden,),
             "lm_head.weight": (d.vocab_size, hidden)}
    layer = {"input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
             "self_attn.q_proj": (q_dim, hidden), "self_attn.k_proj": (kv_dim, hidden),
             "self_attn.v_proj": (kv_dim, hidden), "self_attn.o_proj": (hidden, q_dim),
             "self_attn.q_norm": (head_dim,), "self_attn.k_norm": (head_dim,)}
    if d.is_moe:
        inter = d.moe_intermediate_size
        layer["mlp.gate"] = (d.num_experts, hidden)  # the router: stays bf16 under every quantization
        for e in range(d.num_experts):
            layer.update({f"mlp.experts.{e}.gate_proj": (inter, hidden), f"mlp.experts.{e}.up_proj": (inter, hidden),
                          f"mlp.experts.{e}.down_proj": (hidden, inter)})
    else:
        inter = d.intermediate_size
        layer.update({"mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
                      "mlp.down_proj": (hidden, inter)})
    for i in range(d.num_hidden_layers):
        specs.update({f"model.layers.{i}.{name}.weight": dims for name, dims in layer.items()})
    return dict(sorted(specs.items()))


def is_quantized(name: str, quant: str | None) -> bool:
    """Linear projections are quantized; embeddings, lm_head, norms and the MoE routers are not."""
    return quant == "fp8" and name.endswith("_proj.weight")


def stored_tensors(shape: str, num_layers: int | None = None,
                   quant: str | None = None) -> dict[str, StoredTensor]:
    """What the checkpoint files hold, in write order: with fp8, each quantized weight then its scales."""
    out: dict[str, StoredTensor] = {}
    for name, dims in tensor_specs(shape, num_layers).items():
        if is_quantized(name, quant):
            out[name] = StoredTensor("F8_E4M3", dims)
            out[name + "_scale_inv"] = StoredTensor(fp8_block.SCALE_DTYPE, fp8_block.scale_shape(dims))
        else:
            out[name] = StoredTensor("BF16", dims)
    return out


def seed_for(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest(), "big")


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to bf16, as little-endian uint16 (same rule as torch's .to(bf16))."""
    bits = x.astype("<f4").view("<u4")
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype("<u2")


def bf16_weight_bits(name: str, shape: tuple[int, ...], seed: int, chunk: int = CHUNK) -> np.ndarray:
    """HF init, as bf16 bits: norms are ones, every other weight is normal(0, INIT_STD) from its own stream.

    Drawn `chunk` values at a time: a 151936 x 4096 embedding would otherwise hold ~10 GB of float32 and uint32
    temporaries. The stream is the same whatever the chunk (numpy keeps the generator's state between calls)."""
    numel = int(np.prod(shape))
    if name.endswith("norm.weight"):
        return np.full(numel, 0x3F80, dtype="<u2")  # bf16 1.0
    # PCG64 is stable across numpy versions and platforms; standard_normal's float32 ziggurat uses
    # only table lookups and IEEE arithmetic on its hot path.
    rng = np.random.Generator(np.random.PCG64(seed_for(seed, name)))
    out = np.empty(numel, dtype="<u2")
    for start in range(0, numel, chunk):
        values = rng.standard_normal(min(chunk, numel - start), dtype=np.float32)
        values *= np.float32(INIT_STD)
        out[start:start + len(values)] = float32_to_bf16_bits(values)
    return out


def _as_bytes(array: np.ndarray) -> memoryview:
    return np.ascontiguousarray(array).data.cast("B")  # the bytes without a copy (a 1.2 GB embedding would double)


def _group_bytes(group: Sequence[str], shape: tuple[int, ...], seed: int, quant: str | None) -> list[memoryview]:
    """A parameter's stored bytes: bf16, or (fp8 codes, bf16 scales) block-quantized from those bf16 values,
    so the fp8 checkpoint of a seed is the quantization of the bf16 checkpoint of the same seed."""
    bits = bf16_weight_bits(group[0], shape, seed)
    if not is_quantized(group[0], quant):
        return [_as_bytes(bits)]
    codes, scales = fp8_block.quantize_blocks(fp8_block.bf16_bits_to_float32(bits).reshape(shape))
    return [_as_bytes(codes), _as_bytes(scales.astype("<u2"))]


def _write_json_files(out_dir: Path, shape: str, num_layers: int | None, quant: str | None) -> None:
    for name, obj in json_files(shape, num_layers, quant).items():
        text = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
        (out_dir / name).write_text(text, encoding="utf-8")


def _write_model(out_dir: Path, shape: str, seed: int, num_layers: int | None, quant: str | None) -> None:
    _write_json_files(out_dir, shape, num_layers, quant)
    specs, stored = tensor_specs(shape, num_layers), stored_tensors(shape, num_layers, quant)
    groups = [(name, name + "_scale_inv") if is_quantized(name, quant) else (name,) for name in specs]
    write_checkpoint(out_dir, stored, groups, lambda g: _group_bytes(g, specs[g[0]], seed, quant))
    # Written last; sizes let ensure_model spot a truncated or deleted file without hashing GBs.
    sizes = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir())}
    manifest = {"generator_version": GENERATOR_VERSION, "shape": shape, "seed": seed,
                "num_layers": resolve(shape, num_layers).num_hidden_layers, "quant": quant, "file_sizes": sizes}
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def generate_model(out_dir: Path, shape: str = "tiny", seed: int = 0, *, num_layers: int | None = None,
                   quant: str | None = None) -> Path:
    """Write the model to out_dir, replacing whatever is there. Readers never see a partial dir."""
    resolve(shape, num_layers, quant)
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    start_s = time.monotonic()
    # The temp dir sits next to out_dir so the final rename stays on one filesystem (atomic).
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_model(tmp_dir, shape, seed, num_layers, quant)
        os.chmod(tmp_dir, 0o755)
        if out_dir.exists():
            # rename() cannot replace a non-empty dir: move the old one aside first. The window
            # where out_dir is absent reads as "missing", never as "half-written".
            old_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old_dir / "model")
            shutil.rmtree(old_dir)
        try:
            os.replace(tmp_dir, out_dir)
        except OSError:
            # A concurrent generator installed its copy first; the bytes are the same, keep it.
            if not is_model_complete(out_dir, shape, seed, num_layers=num_layers, quant=quant):
                raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("model_generated", out_dir=str(out_dir), shape=shape, seed=seed, num_layers=num_layers,
                quant=quant, elapsed_s=round(time.monotonic() - start_s, 2))
    return out_dir


def write_config_only(out_dir: Path, shape: str, *, num_layers: int | None = None, quant: str | None = None) -> Path:
    """The model's JSON files without its weights (no manifest: ensure_model never takes it for a whole model)."""
    resolve(shape, num_layers, quant)
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json_files(out_dir, shape, num_layers, quant)
    return out_dir


def is_model_complete(out_dir: Path, shape: str, seed: int, *, num_layers: int | None = None,
                      quant: str | None = None) -> bool:
    """True when out_dir holds this generator's output for these options with every file whole."""
    try:
        manifest = json.loads((Path(out_dir) / MANIFEST_NAME).read_text(encoding="utf-8"))
        # Manifests from before num_layers and quant existed describe the default of both.
        layers = manifest.get("num_layers", SHAPES[manifest["shape"]].num_hidden_layers)
        wanted = (GENERATOR_VERSION, shape, seed, resolve(shape, num_layers).num_hidden_layers, quant)
        return (manifest["generator_version"], manifest["shape"], manifest["seed"], layers,
                manifest.get("quant")) == wanted and all(
            (Path(out_dir) / name).stat().st_size == size for name, size in manifest["file_sizes"].items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def ensure_model(out_dir: Path, shape: str = "tiny", seed: int = 0, *, num_layers: int | None = None,
                 quant: str | None = None) -> Path:
    """Generate the model unless out_dir already holds a complete copy for these options."""
    if is_model_complete(out_dir, shape, seed, num_layers=num_layers, quant=quant):
        logger.info("model_present", out_dir=str(out_dir), shape=shape, seed=seed, num_layers=num_layers,
                    quant=quant)
        return Path(out_dir).resolve()
    return generate_model(out_dir, shape, seed, num_layers=num_layers, quant=quant)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--num-layers", type=int, default=None,
                        help="decoder layers (qwen3-235b-a22b only, and required there)")
    parser.add_argument("--quant", choices=QUANTS, default=None,
                        help="fp8: block-quantized e4m3 weights with 128x128 scales, as Qwen's FP8 releases")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="regenerate even if complete")
    parser.add_argument("--config-only", action="store_true",
                        help="the JSON files alone (config, tokenizer, quantization), no weights: for vLLM's "
                             "`--load-format dummy`, which measures speed and memory at full size without the disk")
    args = parser.parse_args(argv)
    try:
        resolve(args.shape, args.num_layers, args.quant)
    except ValueError as e:
        parser.error(str(e))  # exit 2, one line after the usage
    configure_logging()  # logs to stderr: stdout carries only the model path, for scripts
    if args.config_only:
        print(write_config_only(args.out, args.shape, num_layers=args.num_layers, quant=args.quant))
        return
    make = generate_model if args.force else ensure_model
    print(make(args.out, args.shape, args.seed, num_layers=args.num_layers, quant=args.quant))


if __name__ == "__main__":
    main()
