"""Model generator: owns writing a local, randomly initialised HF Qwen3 model directory.

There is no model hub, so every deployment builds its model from (shape, seed). The output must be
byte-identical on every machine and with any torch/tokenizers version, because PoC artifacts computed
on one host are checked on another. Hence: JSON files are hand-written with fixed key order, the
safetensors file is streamed by hand (no library layout choices), weights come from per-tensor
PCG64 streams and are rounded to bf16 with explicit integer arithmetic.

    python -m backend.tools.modelgen --out DIR [--shape tiny|qwen3-0.6b] [--seed 0] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import shutil
import struct
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import structlog

from common.logs import configure_logging

logger = structlog.get_logger(__name__)

# Bump when any output byte changes; a directory written by another version is regenerated.
GENERATOR_VERSION = 1
MANIFEST_NAME = "pocserve_model.json"
VOCAB_SIZE = 512  # bytes + merges + specials, padded with reserved tokens; a multiple of 64
INIT_STD = 0.02
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Qwen2's pre-tokenizer regex. Using Qwen's exact pipeline means transformers v5's Qwen2Tokenizer,
# which rebuilds the pipeline in code, would tokenize identically to tokenizer.json.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# Each entry becomes a chain of merges ending in a single token, in this order (earlier = lower
# rank). Hand-listed instead of trained: BPE training breaks frequency ties nondeterministically.
MERGE_WORDS = (
    " the", " of", " and", " to", " in", " is", " that", " for", " it", " as", " with", " was",
    " on", " be", " by", " are", " this", " you", " not", " or", " have", " from", " at", " an",
    " which", " one", " but", " all", " can", " will", " we", " they", " he", " she", " his",
    " her", " their", " there", " what", " if", " would", " about", " more", " some", " when",
    " out", " so", " up", " do", " no", " my", " your", " me", " how", " time", " just", " know",
    " people", " into", " year", " good", " model", " token", " hello", " world", " answer",
    " question", " user", " assistant", " system", "user", "assistant", "system", "ing", "ed",
    "er", "ly", "tion", "es", "The", "Hello", "\n\n", "  ", "    ", ".\n",
)

_SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "max_position_embeddings")
SHAPES: dict[str, dict[str, int]] = {
    "tiny": dict(zip(_SHAPE_KEYS, (256, 768, 4, 4, 2, 64, 4096), strict=False)),
    "qwen3-0.6b": dict(zip(_SHAPE_KEYS, (1024, 3072, 28, 16, 8, 128, 40960), strict=False)),
}


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable char map used by the ByteLevel pre-tokenizer."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)}
    unprintable = [b for b in range(256) if b not in printable]
    return {b: chr(b) if b in printable else chr(256 + unprintable.index(b)) for b in range(256)}


def _apply_merges(pieces: list[str], ranks: dict[tuple[str, str], int]) -> list[str]:
    """Plain BPE: repeatedly merge the adjacent pair of lowest rank."""
    while len(pieces) > 1:
        pairs = [(ranks.get(p, len(ranks)), i) for i, p in enumerate(itertools.pairwise(pieces))]
        rank, i = min(pairs)
        if rank == len(ranks):
            return pieces
        pieces = [*pieces[:i], pieces[i] + pieces[i + 1], *pieces[i + 2:]]
    return pieces


def build_vocab() -> tuple[list[str], list[tuple[str, str]]]:
    """Return (BPE tokens by id, merges); ids 0..255 are the bytes themselves."""
    to_char = byte_to_unicode()
    ranks: dict[tuple[str, str], int] = {}  # insertion order == rank order
    for word in MERGE_WORDS:
        pieces = _apply_merges([to_char[b] for b in word.encode()], ranks)
        while len(pieces) > 1:
            ranks.setdefault((pieces[0], pieces[1]), len(ranks))
            pieces = [pieces[0] + pieces[1], *pieces[2:]]
    # A merge result is at least two chars, so it never collides with a byte token.
    tokens = [*(to_char[b] for b in range(256)), *dict.fromkeys(a + b for a, b in ranks)]
    assert len(tokens) + len(SPECIAL_TOKENS) <= VOCAB_SIZE, "MERGE_WORDS overflow the vocab"
    return tokens, list(ranks)


def tokenizer_json() -> dict:
    """tokenizer.json as the tokenizers library serialises it, minus version-specific fields."""
    tokens, merges = build_vocab()
    # Qwen specials directly after the BPE vocab, then reserved pads up to VOCAB_SIZE.
    num_reserved = VOCAB_SIZE - len(tokens) - len(SPECIAL_TOKENS)
    specials = [*SPECIAL_TOKENS, *(f"<|reserved_special_token_{i}|>" for i in range(num_reserved))]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    added = [{"id": len(tokens) + i, "content": tok, "single_word": False, "lstrip": False,
              "rstrip": False, "normalized": False, "special": True}
             for i, tok in enumerate(specials)]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PRETOKENIZE_REGEX}, "behavior": "Isolated",
             "invert": False},
            byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        # Merges as "a b" strings: the one format every tokenizers release reads (no token holds a
        # space, ByteLevel maps it to "Ġ").
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "vocab": {tok: i for i, tok in enumerate(tokens)},
                  "merges": [f"{a} {b}" for a, b in merges]},
    }


def json_files(shape: str) -> dict[str, dict]:
    """File name -> content of every JSON file in the model directory."""
    dims, tok = SHAPES[shape], tokenizer_json()
    ids = {t["content"]: t["id"] for t in tok["added_tokens"]}
    config = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "torch_dtype": "bfloat16",
        "vocab_size": VOCAB_SIZE, **dims, "hidden_act": "silu", "attention_bias": False,
        "attention_dropout": 0.0, "initializer_range": INIT_STD, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0, "rope_scaling": None, "tie_word_embeddings": False,
        "use_cache": True, "use_sliding_window": False, "sliding_window": None,
        "max_window_layers": dims["num_hidden_layers"],
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|im_end|>"],
    }
    # PreTrainedTokenizerFast loads tokenizer.json verbatim on transformers v4 and v5; with a
    # Qwen2 class name v5 would rebuild the pipeline in code.
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": None, "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>", "unk_token": None, "add_bos_token": False,
        "add_eos_token": False, "clean_up_tokenization_spaces": False, "errors": "replace",
        "split_special_tokens": False, "model_max_length": dims["max_position_embeddings"],
        "chat_template": CHAT_TEMPLATE,
    }
    # No sampling defaults: vLLM applies generation_config values as request defaults.
    generation_config = {"bos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
                         "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]]}
    return {"config.json": config, "generation_config.json": generation_config,
            "tokenizer.json": tok, "tokenizer_config.json": tokenizer_config}


def tensor_specs(shape: str) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every Qwen3ForCausalLM parameter, sorted by name (the write order)."""
    d = SHAPES[shape]
    hidden, inter, head_dim = d["hidden_size"], d["intermediate_size"], d["head_dim"]
    q_dim, kv_dim = d["num_attention_heads"] * head_dim, d["num_key_value_heads"] * head_dim
    specs = {"model.embed_tokens.weight": (VOCAB_SIZE, hidden), "model.norm.weight": (hidden,),
             "lm_head.weight": (VOCAB_SIZE, hidden)}
    layer = {"input_layernorm": (hidden,), "post_attention_layernorm": (hidden,),
             "self_attn.q_proj": (q_dim, hidden), "self_attn.k_proj": (kv_dim, hidden),
             "self_attn.v_proj": (kv_dim, hidden), "self_attn.o_proj": (hidden, q_dim),
             "self_attn.q_norm": (head_dim,), "self_attn.k_norm": (head_dim,),
             "mlp.gate_proj": (inter, hidden), "mlp.up_proj": (inter, hidden),
             "mlp.down_proj": (hidden, inter)}
    for i in range(d["num_hidden_layers"]):
        specs.update({f"model.layers.{i}.{name}.weight": dims for name, dims in layer.items()})
    return dict(sorted(specs.items()))


def seed_for(seed: int, name: str) -> int:
    return int.from_bytes(hashlib.sha256(f"{seed}:{name}".encode()).digest(), "big")


def float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to bf16, as little-endian uint16 (same rule as torch's .to(bf16))."""
    bits = x.astype("<f4").view("<u4")
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype("<u2")


def tensor_bytes(name: str, shape: tuple[int, ...], seed: int) -> bytes:
    """HF init: norms are ones, every other weight is normal(0, INIT_STD) from its own stream."""
    numel = int(np.prod(shape))
    if name.endswith("norm.weight"):
        return np.full(numel, 0x3F80, dtype="<u2").tobytes()  # bf16 1.0
    # PCG64 is stable across numpy versions and platforms; standard_normal's float32 ziggurat uses
    # only table lookups and IEEE arithmetic on its hot path.
    rng = np.random.Generator(np.random.PCG64(seed_for(seed, name)))
    values = rng.standard_normal(numel, dtype=np.float32) * np.float32(INIT_STD)
    return float32_to_bf16_bits(values).tobytes()


def write_safetensors(path: Path, specs: dict[str, tuple[int, ...]], seed: int) -> None:
    """Stream tensors into a safetensors file; header fixed by specs, data in spec order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    end = 0
    for name, shape in specs.items():
        start, end = end, end + int(np.prod(shape)) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [start, end]}
    header_bytes = json.dumps(header, separators=(",", ":")).encode()
    header_bytes += b" " * (-len(header_bytes) % 8)  # keep the data section 8-byte aligned
    items, num_workers = list(specs.items()), os.cpu_count() or 1
    with open(path, "wb") as f, ThreadPoolExecutor(num_workers) as pool:
        f.write(struct.pack("<Q", len(header_bytes)) + header_bytes)
        # Windows of tensors bound memory; numpy drops the GIL while filling, so threads scale.
        for start in range(0, len(items), 4 * num_workers):
            names, shapes = zip(*items[start:start + 4 * num_workers], strict=False)
            for data in pool.map(tensor_bytes, names, shapes, [seed] * len(names)):
                f.write(data)


def _write_model(out_dir: Path, shape: str, seed: int) -> None:
    for name, obj in json_files(shape).items():
        text = json.dumps(obj, indent=2, ensure_ascii=False) + "\n"
        (out_dir / name).write_text(text, encoding="utf-8")
    write_safetensors(out_dir / "model.safetensors", tensor_specs(shape), seed)
    # Written last; sizes let ensure_model spot a truncated or deleted file without hashing 1 GB.
    sizes = {p.name: p.stat().st_size for p in sorted(out_dir.iterdir())}
    manifest = {"generator_version": GENERATOR_VERSION, "shape": shape, "seed": seed,
                "file_sizes": sizes}
    (out_dir / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")


def generate_model(out_dir: Path, shape: str = "tiny", seed: int = 0) -> Path:
    """Write the model to out_dir, replacing whatever is there. Readers never see a partial dir."""
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}, expected one of {sorted(SHAPES)}")
    out_dir = Path(out_dir).resolve()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    start_s = time.monotonic()
    # The temp dir sits next to out_dir so the final rename stays on one filesystem (atomic).
    tmp_dir = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.tmp-", dir=out_dir.parent))
    try:
        _write_model(tmp_dir, shape, seed)
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
            if not is_model_complete(out_dir, shape, seed):
                raise
    finally:
        shutil.rmtree(tmp_dir, ignore_errors=True)
    logger.info("model_generated", out_dir=str(out_dir), shape=shape, seed=seed,
                elapsed_s=round(time.monotonic() - start_s, 2))
    return out_dir


def is_model_complete(out_dir: Path, shape: str, seed: int) -> bool:
    """True when out_dir holds this generator's output for (shape, seed) with every file whole."""
    try:
        manifest = json.loads((Path(out_dir) / MANIFEST_NAME).read_text(encoding="utf-8"))
        return (manifest["generator_version"], manifest["shape"], manifest["seed"]) == (
            GENERATOR_VERSION, shape, seed) and all(
            (Path(out_dir) / name).stat().st_size == size
            for name, size in manifest["file_sizes"].items())
    except (OSError, ValueError, KeyError, TypeError):
        return False


def ensure_model(out_dir: Path, shape: str = "tiny", seed: int = 0) -> Path:
    """Generate the model unless out_dir already holds a complete copy for (shape, seed)."""
    if is_model_complete(out_dir, shape, seed):
        logger.info("model_present", out_dir=str(out_dir), shape=shape, seed=seed)
        return Path(out_dir).resolve()
    return generate_model(out_dir, shape, seed)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="model directory to write")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="regenerate even if complete")
    args = parser.parse_args(argv)
    configure_logging()  # logs to stderr: stdout carries only the model path, for scripts
    print((generate_model if args.force else ensure_model)(args.out, args.shape, args.seed))


if __name__ == "__main__":
    main()
