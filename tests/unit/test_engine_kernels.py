"""backend/engine/kernels.py: when a CUDA engine takes DeepGEMM for block-FP8 layers, and when vLLM's choice stands."""

from __future__ import annotations

import types

from backend.engine import kernels

BLOCK_FP8 = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
HOPPER = {"is_hopper": True, "has_deep_gemm": True, "nvcc": "/usr/local/cuda/bin/nvcc"}


def test_deep_gemm_is_the_default_for_block_fp8_on_hopper_with_nvcc():
    assert kernels.why_not(BLOCK_FP8, frozenset(), {}, **HOPPER) is None


def test_vllms_choice_stands_where_anything_differs():
    per_tensor = {"quantization_config": {"quant_method": "fp8"}}
    assert kernels.why_not(per_tensor, frozenset(), {}, **HOPPER) == "not a block-FP8 checkpoint"
    assert kernels.why_not({}, frozenset(), {}, **HOPPER) == "not a block-FP8 checkpoint"
    assert kernels.why_not(BLOCK_FP8, frozenset({"moe_backend"}), {}, **HOPPER) == "--moe-backend given"
    assert kernels.why_not(BLOCK_FP8, frozenset({"linear_backend"}), {"VLLM_USE_DEEP_GEMM_E8M0": "1"},
                           **HOPPER) == "--linear-backend, VLLM_USE_DEEP_GEMM_E8M0 given"
    other_blocks = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [64, 64]}}
    assert kernels.why_not(other_blocks, frozenset(), {}, **HOPPER) == "blocks other than 128 x 128"
    assert "SiLU" in kernels.why_not({**BLOCK_FP8, "hidden_act": "gelu"}, frozenset(), {}, **HOPPER)
    assert "expert parallel" in kernels.why_not(BLOCK_FP8, frozenset({"enable_expert_parallel"}), {}, **HOPPER)
    assert "Hopper" in kernels.why_not(BLOCK_FP8, frozenset(), {}, **{**HOPPER, "is_hopper": False})
    assert "not installed" in kernels.why_not(BLOCK_FP8, frozenset(), {}, **{**HOPPER, "has_deep_gemm": False})
    assert "CUDA_HOME" in kernels.why_not(BLOCK_FP8, frozenset(), {}, **{**HOPPER, "nvcc": None})


def test_nvcc_is_found_where_deep_gemm_looks(tmp_path):
    nvcc = tmp_path / "bin" / "nvcc"
    nvcc.parent.mkdir()
    nvcc.write_text("#!/bin/sh\n")
    nvcc.chmod(0o755)
    assert kernels.find_nvcc({"CUDA_HOME": str(tmp_path)}) == str(nvcc)
    assert kernels.find_nvcc({"CUDA_HOME": str(tmp_path / "none")}) is None


def test_choose_leaves_engine_and_environment_alone_off_hopper():
    engine = types.SimpleNamespace(moe_backend="auto", linear_backend="auto")
    environ: dict[str, str] = {}
    decided = kernels.choose(engine, BLOCK_FP8, frozenset(), environ)  # this machine: vLLM's CPU platform
    assert decided["fp8_kernels"] == "vllm's choice" and "Hopper" in decided["reason"]
    assert (engine.moe_backend, engine.linear_backend, environ) == ("auto", "auto", {})


def test_taking_deep_gemm_keeps_the_checkpoints_scales_and_a_users_warmup_and_cache(tmp_path):
    engine = types.SimpleNamespace(moe_backend="auto", linear_backend="auto")
    environ: dict[str, str] = {}
    decided = kernels.take_deep_gemm(engine, environ, tmp_path)
    assert (engine.moe_backend, engine.linear_backend) == ("deep_gemm", "deep_gemm")
    assert environ["VLLM_USE_DEEP_GEMM_E8M0"] == "0" and environ["VLLM_USE_DEEP_GEMM"] == "1"
    assert environ["VLLM_DEEP_GEMM_WARMUP"] == "skip" and environ["DG_JIT_CACHE_DIR"] == str(tmp_path / "deep_gemm")
    assert decided["fp8_kernels"] == "deep_gemm" and decided["e8m0"] is False
    environ = {"VLLM_DEEP_GEMM_WARMUP": "relax", "DG_JIT_CACHE_DIR": "/cache"}
    kernels.take_deep_gemm(engine, environ, tmp_path)
    assert (environ["VLLM_DEEP_GEMM_WARMUP"], environ["DG_JIT_CACHE_DIR"]) == ("relax", "/cache")
