"""backend/engine/pocworker/forward.py's layout_problem on vLLM's own KV-cache specs, and the start error PocRunner
raises from it (PoC lays every group out on the same leased blocks, which only per-token attention pages of the
cache's block size allow), and which decoder stacks it runs layer by layer."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, MLAAttentionSpec, SlidingWindowSpec

from backend.engine.poc import PocRunner
from backend.engine.pocworker.forward import layout_problem
from backend.engine.pocworker.hooks import is_layerwise
from common.config import SettingsError
from tests.unit.test_poc_runner import BLOCK_SIZE, FakeCore

HEADS = {"num_kv_heads": 2, "head_size": 64, "dtype": torch.bfloat16}


def _problem(*specs) -> str | None:
    groups = [SimpleNamespace(kv_cache_spec=spec) for spec in specs]
    mr = SimpleNamespace(kv_cache_config=SimpleNamespace(kv_cache_groups=groups))
    return layout_problem(mr, SimpleNamespace(cache_config=SimpleNamespace(block_size=BLOCK_SIZE)))


def test_attention_groups_of_the_cache_block_size_are_laid_out():
    # gpt-oss: full and sliding-window groups; DeepSeek: one MLA latent group.
    assert _problem(FullAttentionSpec(block_size=BLOCK_SIZE, **HEADS),
                    SlidingWindowSpec(block_size=BLOCK_SIZE, sliding_window=32, **HEADS)) is None
    assert _problem(MLAAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=576,
                                     dtype=torch.bfloat16)) is None


def test_recurrent_state_and_other_page_sizes_are_named():
    mamba = MambaSpec(block_size=BLOCK_SIZE, shapes=((4, 64),), dtypes=(torch.float32,))
    assert _problem(FullAttentionSpec(block_size=BLOCK_SIZE, **HEADS), mamba) == (
        "KV-cache group 1 (MambaSpec) holds recurrent state, not per-token attention pages")
    assert _problem(FullAttentionSpec(block_size=8, **HEADS)) == (
        f"KV-cache group 0 (FullAttentionSpec) pages 8 tokens, not the cache's {BLOCK_SIZE}")


def test_the_engine_refuses_to_start_with_the_workers_reason():
    core = FakeCore(num_blocks=17)
    core.vllm_config.model_config.architectures = ["HybridForCausalLM"]
    core.layout_problem = "KV-cache group 1 (MambaSpec) holds recurrent state, not per-token attention pages"
    with pytest.raises(SettingsError, match=r"^--model / POCSERVE_MODEL: HybridForCausalLM: KV-cache group 1 "
                                            r"\(MambaSpec\) holds recurrent state.*so PoC cannot lay its prefill"):
        PocRunner(core, max_num_seqs=4, max_batch_tokens=256)


def test_layerwise_stacks_are_the_listed_ones_without_llama_4_scaling():
    def stack(name: str, **config):
        return type(name, (), {"config": SimpleNamespace(**config)})()

    assert is_layerwise(stack("GptOssModel")) and is_layerwise(stack("DeepseekV2Model", llama_4_scaling=None))
    assert not is_layerwise(stack("DeepseekV2Model", llama_4_scaling={"beta": 0.1}))
    assert not is_layerwise(stack("Qwen3NextModel"))
