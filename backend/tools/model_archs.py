"""The generator's architectures beside Qwen3: config.json keys and checkpoint tensor names of each, as its public
releases lay them out (the format vLLM's loader and transformers' conversion mappings both read).

modelgen.py owns the rest (tokenizer, seeded weights, the files' bytes); a Shape whose `arch` is one of ARCHS takes
its config and tensors from here. The tiny shapes keep each architecture's distinguishing parts (MLA with its
LoRA ranks, shared experts, grouped sigmoid routing with a correction bias, partial rotary, per-layer QK norms,
attention sinks and sliding-window layers, biases) at sizes the CPU engine runs in seconds. Every tensor is stored
bf16; norms are ones and everything else normal(0, INIT_STD), as modelgen's rule for all weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Dims = Any  # modelgen.Shape (not imported: modelgen imports this module)
Tensors = dict[str, tuple[int, ...]]

# DeepSeek-V3's MLA ranks at the tiny size. The latent cache is kv_lora_rank + qk_rope_head_dim wide, and vLLM's
# CPU MLA kernel takes only DeepSeek's 576 (512 + 64), so those two stay the release's values.
MLA = {"q_lora_rank": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 32, "v_head_dim": 64}
N_SHARED_EXPERTS = 1
GPT_OSS_SLIDING_WINDOW = 32  # below the tests' 64-token PoC sequences, so the window shapes their artifacts
# gpt-oss's YaRN at the release's ratio (factor 32 over the original context), on a 128-token original context.
GPT_OSS_ROPE = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                "original_max_position_embeddings": 128}


def _attention(d: Dims, *, bias: bool = False, qk_norm: int = 0) -> Tensors:
    """q/k/v/o projections, with biases on q/k/v where `bias` (gpt-oss adds o's bias itself); qk_norm: the width
    of per-head q_norm/k_norm weights, 0 for none."""
    q_dim, kv_dim = d.num_attention_heads * d.head_dim, d.num_key_value_heads * d.head_dim
    out: Tensors = {"self_attn.q_proj.weight": (q_dim, d.hidden_size),
                    "self_attn.k_proj.weight": (kv_dim, d.hidden_size),
                    "self_attn.v_proj.weight": (kv_dim, d.hidden_size),
                    "self_attn.o_proj.weight": (d.hidden_size, q_dim)}
    if bias:
        out.update({"self_attn.q_proj.bias": (q_dim,), "self_attn.k_proj.bias": (kv_dim,),
                    "self_attn.v_proj.bias": (kv_dim,)})
    if qk_norm:
        out.update({"self_attn.q_norm.weight": (qk_norm,), "self_attn.k_norm.weight": (qk_norm,)})
    return out


def _mlp(prefix: str, hidden: int, inter: int, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")):
    gate, up, down = names
    return {f"{prefix}.{gate}.weight": (inter, hidden), f"{prefix}.{up}.weight": (inter, hidden),
            f"{prefix}.{down}.weight": (hidden, inter)}


def _routed(d: Dims, prefix: str, *, names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")) -> Tensors:
    """The experts one by one, as the releases store them."""
    out: Tensors = {}
    for e in range(d.num_experts):
        out.update(_mlp(f"{prefix}.experts.{e}", d.hidden_size, d.moe_intermediate_size, names))
    return out


def _deepseek_moe(d: Dims) -> Tensors:
    """DeepSeek-V3 / GLM-4-MoE's sparse layer: sigmoid router with a correction bias, routed and shared experts."""
    return {"mlp.gate.weight": (d.num_experts, d.hidden_size), "mlp.gate.e_score_correction_bias": (d.num_experts,),
            **_routed(d, "mlp"), **_mlp("mlp.shared_experts", d.hidden_size,
                                          d.moe_intermediate_size * N_SHARED_EXPERTS)}


def _dense_or_moe(d: Dims, index: int, first_dense: int) -> Tensors:
    return _mlp("mlp", d.hidden_size, d.intermediate_size) if index < first_dense else _deepseek_moe(d)


def _norms(d: Dims) -> Tensors:
    return {"input_layernorm.weight": (d.hidden_size,), "post_attention_layernorm.weight": (d.hidden_size,)}


# --- config.json keys beyond modelgen's shared ones (vocab, sizes, heads, context, eps, act, ids)

def _llama_config(d: Dims) -> dict:
    return {"head_dim": d.head_dim, "intermediate_size": d.intermediate_size, "rope_theta": d.rope_theta,
            "rope_scaling": None, "attention_bias": False, "mlp_bias": False, "pretraining_tp": 1}


def _llama_layer(d: Dims, index: int) -> Tensors:
    return {**_norms(d), **_attention(d), **_mlp("mlp", d.hidden_size, d.intermediate_size)}


def _routing(d: Dims) -> dict:
    """DeepSeek's routing keys (GLM-4-MoE shares them): grouped top-k over sigmoid scores plus a correction bias."""
    return {"moe_intermediate_size": d.moe_intermediate_size, "n_routed_experts": d.num_experts,
            "n_shared_experts": N_SHARED_EXPERTS, "num_experts_per_tok": d.num_experts_per_tok,
            "first_k_dense_replace": 1, "norm_topk_prob": True, "num_nextn_predict_layers": 0}


def _deepseek_v3_config(d: Dims) -> dict:
    return {"intermediate_size": d.intermediate_size, **_routing(d), **MLA, "routed_scaling_factor": 2.5,
            "n_group": 2, "topk_group": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc",
            "moe_layer_freq": 1, "rope_theta": d.rope_theta, "rope_scaling": None, "rope_interleave": True,
            "attention_bias": False, "ep_size": 1}


def _deepseek_v3_layer(d: Dims, index: int) -> Tensors:
    heads, m = d.num_attention_heads, MLA
    attn = {"self_attn.q_a_proj.weight": (m["q_lora_rank"], d.hidden_size),
            "self_attn.q_a_layernorm.weight": (m["q_lora_rank"],),
            "self_attn.q_b_proj.weight": (heads * (m["qk_nope_head_dim"] + m["qk_rope_head_dim"]), m["q_lora_rank"]),
            "self_attn.kv_a_proj_with_mqa.weight": (m["kv_lora_rank"] + m["qk_rope_head_dim"], d.hidden_size),
            "self_attn.kv_a_layernorm.weight": (m["kv_lora_rank"],),
            "self_attn.kv_b_proj.weight": (heads * (m["qk_nope_head_dim"] + m["v_head_dim"]), m["kv_lora_rank"]),
            "self_attn.o_proj.weight": (d.hidden_size, heads * m["v_head_dim"])}
    return {**_norms(d), **attn, **_dense_or_moe(d, index, 1)}


def _glm4_moe_config(d: Dims) -> dict:
    return {"head_dim": d.head_dim, "intermediate_size": d.intermediate_size, **_routing(d),
            "routed_scaling_factor": 2.5, "n_group": 1, "topk_group": 1, "partial_rotary_factor": 0.5,
            "rope_theta": d.rope_theta, "rope_scaling": None, "attention_bias": True, "use_qk_norm": True}


def _glm4_moe_layer(d: Dims, index: int) -> Tensors:
    return {**_norms(d), **_attention(d, bias=True, qk_norm=d.head_dim), **_dense_or_moe(d, index, 1)}


def _minimax_m2_config(d: Dims) -> dict:
    # MiniMax-M2 names the expert width intermediate_size and gives partial RoPE as rotary_dim (half a head). The
    # factor is also written out: transformers reads rotary_dim only since its config learned the legacy name (5.x
    # here); an HF reference that read neither would rotate whole heads (vLLM reads rotary_dim first either way).
    return {"head_dim": d.head_dim, "intermediate_size": d.moe_intermediate_size, "rotary_dim": d.head_dim // 2,
            "partial_rotary_factor": 0.5,
            "num_local_experts": d.num_experts, "num_experts_per_tok": d.num_experts_per_tok,
            "scoring_func": "sigmoid", "use_routing_bias": True, "use_qk_norm": True, "qk_norm_type": "per_layer",
            "attn_type_list": [1] * d.num_hidden_layers, "rope_theta": d.rope_theta, "rope_scaling": None,
            "router_aux_loss_coef": 0.001, "output_router_logits": False}


def _minimax_m2_layer(d: Dims, index: int) -> Tensors:
    attn = _attention(d)
    # Its QK norms span the whole projection (all heads), not one head.
    attn.update({"self_attn.q_norm.weight": (d.num_attention_heads * d.head_dim,),
                 "self_attn.k_norm.weight": (d.num_key_value_heads * d.head_dim,)})
    moe = {"block_sparse_moe.gate.weight": (d.num_experts, d.hidden_size),
           "block_sparse_moe.e_score_correction_bias": (d.num_experts,),
           **_routed(d, "block_sparse_moe", names=("w1", "w3", "w2"))}
    return {**_norms(d), **attn, **moe}


def _gpt_oss_config(d: Dims) -> dict:
    layer_types = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(d.num_hidden_layers)]
    return {"head_dim": d.head_dim, "intermediate_size": d.moe_intermediate_size, "num_local_experts": d.num_experts,
            "num_experts_per_tok": d.num_experts_per_tok, "experts_per_token": d.num_experts_per_tok,
            "sliding_window": GPT_OSS_SLIDING_WINDOW, "layer_types": layer_types, "attention_bias": True,
            "swiglu_limit": 7.0, "rope_theta": d.rope_theta, "rope_scaling": GPT_OSS_ROPE,
            "initial_context_length": GPT_OSS_ROPE["original_max_position_embeddings"],
            "router_aux_loss_coef": 0.9, "output_router_logits": False}


def _gpt_oss_layer(d: Dims, index: int) -> Tensors:
    e, hidden, inter = d.num_experts, d.hidden_size, d.moe_intermediate_size
    attn = {**_attention(d, bias=True), "self_attn.o_proj.bias": (hidden,),
            "self_attn.sinks": (d.num_attention_heads,)}
    # The bf16 release's fused experts: gate and up interleaved along the last axis of gate_up_proj.
    moe = {"mlp.router.weight": (e, hidden), "mlp.router.bias": (e,),
           "mlp.experts.gate_up_proj": (e, hidden, 2 * inter), "mlp.experts.gate_up_proj_bias": (e, 2 * inter),
           "mlp.experts.down_proj": (e, inter, hidden), "mlp.experts.down_proj_bias": (e, hidden)}
    return {**_norms(d), **attn, **moe}


@dataclass(frozen=True)
class Arch:
    architecture: str
    model_type: str
    config: Callable[[Dims], dict]
    layer: Callable[[Dims, int], Tensors]
    rms_norm_eps: float = 1e-6


ARCHS: dict[str, Arch] = {
    "llama": Arch("LlamaForCausalLM", "llama", _llama_config, _llama_layer, 1e-5),
    "deepseek_v3": Arch("DeepseekV3ForCausalLM", "deepseek_v3", _deepseek_v3_config, _deepseek_v3_layer),
    "glm4_moe": Arch("Glm4MoeForCausalLM", "glm4_moe", _glm4_moe_config, _glm4_moe_layer, 1e-5),
    "minimax_m2": Arch("MiniMaxM2ForCausalLM", "minimax_m2", _minimax_m2_config, _minimax_m2_layer),
    "gpt_oss": Arch("GptOssForCausalLM", "gpt_oss", _gpt_oss_config, _gpt_oss_layer, 1e-5),
}


def config(d: Dims, init_std: float) -> dict:
    """config.json of shape `d` (d.arch in ARCHS) without the token ids, which modelgen appends."""
    arch = ARCHS[d.arch]
    return {"architectures": [arch.architecture], "model_type": arch.model_type, "torch_dtype": "bfloat16",
            "vocab_size": d.vocab_size, "hidden_size": d.hidden_size, "num_hidden_layers": d.num_hidden_layers,
            "num_attention_heads": d.num_attention_heads, "num_key_value_heads": d.num_key_value_heads,
            "max_position_embeddings": d.max_position_embeddings, **arch.config(d), "hidden_act": "silu",
            "attention_dropout": 0.0, "initializer_range": init_std, "rms_norm_eps": arch.rms_norm_eps,
            "tie_word_embeddings": False, "use_cache": True}


def tensor_specs(d: Dims) -> Tensors:
    """Name -> shape of every parameter of shape `d`, sorted by name."""
    specs: Tensors = {"model.embed_tokens.weight": (d.vocab_size, d.hidden_size), "model.norm.weight": (d.hidden_size,),
                      "lm_head.weight": (d.vocab_size, d.hidden_size)}
    for i in range(d.num_hidden_layers):
        specs.update({f"model.layers.{i}.{name}": dims for name, dims in ARCHS[d.arch].layer(d, i).items()})
    return dict(sorted(specs.items()))
