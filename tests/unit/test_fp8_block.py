"""Unit tests for backend.tools.fp8_block: e4m3 rounding against torch, block scales, round trips."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from backend.tools import fp8_block


def _torch_e4m3_bits(values: np.ndarray) -> np.ndarray:
    return torch.from_numpy(values).to(torch.float8_e4m3fn).view(torch.uint8).numpy()


def _torch_e4m3_values(codes: np.ndarray) -> np.ndarray:
    """e4m3fn codes → float32, decoded by torch (what vLLM's loader does with them)."""
    return torch.from_numpy(np.ascontiguousarray(codes, dtype=np.uint8)).view(torch.float8_e4m3fn).float().numpy()


def _dequantize(codes: np.ndarray, scale_bits: np.ndarray) -> np.ndarray:
    """The inverse of quantize_blocks up to rounding: each code's value × its block's bf16 scale."""
    out_dim, in_dim = codes.shape
    scale = fp8_block.bf16_bits_to_float32(scale_bits)
    per_element = np.repeat(np.repeat(scale, fp8_block.BLOCK, axis=0), fp8_block.BLOCK, axis=1)[:out_dim, :in_dim]
    return _torch_e4m3_values(codes) * per_element


E4M3_VALUES = _torch_e4m3_values(np.arange(256))


def test_float32_to_e4m3_bits_matches_torch_in_range() -> None:
    rng = np.random.default_rng(0)
    values = np.concatenate([
        rng.standard_normal(200_000).astype(np.float32) * 100,
        rng.uniform(-2.0 ** -5, 2.0 ** -5, 100_000).astype(np.float32),  # subnormals and the normal boundary
        E4M3_VALUES[np.isfinite(E4M3_VALUES)],  # every representable value
    ]).astype(np.float32)
    finite = E4M3_VALUES[np.isfinite(E4M3_VALUES)]
    positive = np.unique(finite[finite > 0])
    midpoints = ((positive[:-1].astype(np.float64) + positive[1:]) / 2).astype(np.float32)  # exact ties
    values = np.concatenate([values, midpoints, -midpoints, [0.0, -0.0, 448.0, -448.0]]).astype(np.float32)
    values = np.clip(values, -448, 448)
    assert np.array_equal(fp8_block.float32_to_e4m3_bits(values), _torch_e4m3_bits(values))


def test_float32_to_e4m3_bits_saturates_and_refuses_non_finite() -> None:
    assert list(fp8_block.float32_to_e4m3_bits(np.array([460.0, 1e6, -1e6], dtype=np.float32))) == [
        0x7E, 0x7E, 0xFE]
    with pytest.raises(ValueError, match="non-finite"):
        fp8_block.float32_to_e4m3_bits(np.array([np.nan], dtype=np.float32))


@pytest.mark.parametrize("shape", [(256, 256), (200, 300), (1, 129), (384, 96)])
def test_quantize_blocks_shapes_and_round_trip(shape: tuple[int, int]) -> None:
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal(shape) * 0.02).astype(np.float32)
    weight[: min(128, shape[0]), : min(128, shape[1])] *= 50  # blocks of very different ranges
    codes, scale_bits = fp8_block.quantize_blocks(weight)
    assert codes.shape == shape and codes.dtype == np.uint8
    assert scale_bits.shape == fp8_block.scale_shape(shape) == (-(-shape[0] // 128), -(-shape[1] // 128))
    scale = fp8_block.bf16_bits_to_float32(scale_bits)
    restored = _dequantize(codes, scale_bits)
    error = np.abs(restored - weight)
    per_element_scale = np.repeat(np.repeat(scale, 128, 0), 128, 1)[: shape[0], : shape[1]]
    assert (error <= np.abs(weight) / 16 + per_element_scale / 1024).all()
    # Each block uses its range: its largest magnitude lands near the top of e4m3 (448, within bf16's scale).
    top = np.abs(_torch_e4m3_values(codes)).max()
    assert 400 <= top <= 448


def test_quantize_blocks_of_zeros_is_zero_with_unit_scale() -> None:
    codes, scale_bits = fp8_block.quantize_blocks(np.zeros((130, 5), dtype=np.float32))
    assert not codes.any() and (fp8_block.bf16_bits_to_float32(scale_bits) == 1.0).all()
