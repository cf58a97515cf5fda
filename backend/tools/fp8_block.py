"""Block FP8 quantization for the model generator: float8_e4m3fn weights with per-block inverse scales.

The layout of Qwen's FP8 releases (Qwen3-235B-A22B-Instruct-2507-FP8), which vLLM's `fp8` method loads:
a linear weight [out, in] is stored as e4m3fn codes of the same shape, and `<name>_scale_inv` holds one
scale per 128x128 block, shape [ceil(out/128), ceil(in/128)], with weight ≈ code value × scale.

Everything is numpy integer arithmetic or correctly rounded IEEE float32 operations (division, max), so the
codes are the same bytes on every machine, whatever torch or numpy SIMD paths are present.
"""

from __future__ import annotations

import numpy as np

BLOCK = 128
E4M3_MAX = 448.0  # largest finite float8_e4m3fn (0x7E); the format has no infinities
# Qwen's FP8 checkpoints store the inverse scales in bf16; vLLM's loader copies them into float32.
SCALE_DTYPE = "BF16"


def float32_to_e4m3_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even to float8_e4m3fn codes (uint8), as torch's .to(float8_e4m3fn) does in range.

    Magnitudes above 448 saturate to 448 (torch would give NaN); callers scale into range first, so this
    only absorbs a scale that bf16 rounding made slightly too small."""
    x = np.asarray(x, dtype=np.float32)
    if not np.isfinite(x).all():
        raise ValueError("e4m3 quantization of a non-finite value")
    mag = np.minimum(np.abs(x), np.float32(E4M3_MAX))
    bits = mag.view(np.uint32)
    # Normal range (>= 2^-6): drop 20 of float32's 23 mantissa bits with round-half-even; a carry into the
    # exponent is the right result. Re-bias the exponent from 127 to 7: subtract 120 << 3.
    rounded = (bits + np.uint32(0x7FFFF) + ((bits >> 20) & np.uint32(1))) >> 20
    normal = rounded.astype(np.int64) - (120 << 3)
    # Subnormals step by 2^-9; scaling by 2^9 is exact and rint rounds half to even (8 = the smallest normal).
    subnormal = np.rint(mag * np.float32(512.0)).astype(np.int64)
    codes = np.where(mag >= np.float32(2.0 ** -6), normal, subnormal)
    sign = (np.signbit(x).astype(np.int64) << 7)
    return (codes | sign).astype(np.uint8)


def bf16_bits_to_float32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def _float32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)


def quantize_blocks(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """weight [out, in] float32 -> (e4m3 codes [out, in] uint8, bf16 bits of the inverse scales
    [ceil(out/128), ceil(in/128)] uint16). Scale = block amax / 448, rounded to bf16; the codes are taken
    against the rounded scale, so code value × stored scale is the dequantized weight."""
    out_dim, in_dim = weight.shape
    rows, cols = -(-out_dim // BLOCK), -(-in_dim // BLOCK)
    padded = np.zeros((rows * BLOCK, cols * BLOCK), dtype=np.float32)
    padded[:out_dim, :in_dim] = weight
    amax = np.abs(padded).reshape(rows, BLOCK, cols, BLOCK).max(axis=(1, 3))
    scale_bits = _float32_to_bf16_bits(amax / np.float32(E4M3_MAX))
    scale = bf16_bits_to_float32(scale_bits)
    scale = np.where(scale > 0, scale, np.float32(1.0))  # an all-zero block: any scale, codes are 0
    scale_bits = _float32_to_bf16_bits(scale)
    per_element = np.repeat(np.repeat(scale, BLOCK, axis=0), BLOCK, axis=1)[:out_dim, :in_dim]
    return float32_to_e4m3_bits(weight / per_element), scale_bits


def scale_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    out_dim, in_dim = shape
    return -(-out_dim // BLOCK), -(-in_dim // BLOCK)
