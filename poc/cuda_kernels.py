"""Fused CUDA (Triton) versions of the two PoC hot loops, value-for-value equal to the torch reference.

The torch code in poc/rng.py and poc/transforms.py is the definition; these kernels only fuse it:
- `normal_into`: murmur3 → uniforms → Box–Muller → cast, one kernel instead of ~70 full-size int64 passes
  (8 ms of a 32×1024 batch on an H100). Integer math is exact in any order; the float steps use the same
  correctly rounded operations as torch's CUDA kernels (libdevice logf/cosf/sinf, sqrt.rn, one rounding per
  multiply), so every value is bit-identical (tests/unit/test_poc_cuda.py checks it on a GPU).
- `reflect_rows`: the per-layer Householder reflection x − 2(x·v)v of bf16/fp16 activations in one pass,
  with the reference's roundings (product, dot, 2·dot·v and the difference each rounded to the activation
  dtype). Only the fp32 summation order inside the dot differs from torch's reduction, as it does between any
  two GPUs' reductions, so a dot can differ in its last bit (seen for fp16, never for bf16 on an H100).

Both launch with enable_fp_fusion=False: Triton otherwise contracts x − (2·dot)·v into one FMA and skips the
rounding of the product, which changed about 5% of the reflected bf16 values.

Used only for CUDA tensors when Triton imports (`available()`); POCSERVE_POC_TRITON=0 turns them off.
"""

import functools
import os

import torch

MAX_FUSED_HIDDEN = 16384

try:  # a CPU build of torch ships a Triton without GPU backends: importable, never used here
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except Exception:
    triton = None


@functools.cache
def _enabled() -> bool:
    return triton is not None and os.environ.get("POCSERVE_POC_TRITON", "1") != "0" and torch.cuda.is_available()


def available(t: torch.Tensor) -> bool:
    return t.is_cuda and _enabled()


if triton is not None:
    @triton.jit
    def _mul32(x, c: tl.constexpr):
        return x * tl.full((), c, tl.uint32)  # uint32 arithmetic wraps mod 2^32, as the fork's murmur does

    @triton.jit
    def _rotl32(x, r: tl.constexpr):
        return (x << r) | (x >> (32 - r))

    @triton.jit
    def _murmur(key, seed):
        k = _mul32(key, 0xCC9E2D51)
        k = _rotl32(k, 15)
        k = _mul32(k, 0x1B873593)
        h = seed ^ k
        h = _rotl32(h, 13)
        h = h * tl.full((), 5, tl.uint32) + tl.full((), 0xE6546B64, tl.uint32)
        h = h ^ (h >> 16)
        h = _mul32(h, 0x85EBCA6B)
        h = h ^ (h >> 13)
        h = _mul32(h, 0xC2B2AE35)
        h = h ^ (h >> 16)
        return h

    @triton.jit
    def normal_kernel(out_ptr, seeds_ptr, row_stride, n, num_pairs, two_pi, u1_min,
                      BLOCK: tl.constexpr):
        row = tl.program_id(0)
        i = tl.program_id(1).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = i < num_pairs
        seed = tl.load(seeds_ptr + row).to(tl.uint32)
        # Pair keys are < 2^32 (the torch path's int64 keys are masked to 32 bits the same way).
        h1 = _murmur(i.to(tl.uint32), seed)
        h2 = _murmur((i + num_pairs).to(tl.uint32), seed)
        # float(h) / 2^32: the conversion rounds to nearest like torch's; scaling by 2^-32 is exact.
        u1 = tl.maximum(h1.to(tl.float32) * 2.3283064365386963e-10, u1_min)
        u2 = h2.to(tl.float32) * 2.3283064365386963e-10
        r = libdevice.sqrt_rn(libdevice.log(u1) * -2.0)
        theta = u2 * two_pi
        base = out_ptr + row.to(tl.int64) * row_stride
        tl.store(base + i, (r * libdevice.cos(theta)).to(out_ptr.dtype.element_ty), mask=mask)
        sin_col = num_pairs + i
        tl.store(base + sin_col, (r * libdevice.sin(theta)).to(out_ptr.dtype.element_ty),
                 mask=mask & (sin_col < n))

    @triton.jit
    def _reflect_row(x_ptr, v_ptr, out_ptr, row, num_cols, BLOCK: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        mask = cols < num_cols
        dtype = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * num_cols + cols, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        prod = (x * v).to(dtype).to(tl.float32)             # torch: x * v in the activation dtype
        dot = tl.sum(prod, axis=0).to(dtype).to(tl.float32)  # .sum(): fp32 accumulation, one rounding
        scaled = (dot * 2.0).to(dtype).to(tl.float32)        # 2 * dot
        update = (scaled * v).to(dtype).to(tl.float32)       # (2·dot) * v
        tl.store(out_ptr + row * num_cols + cols, (x - update).to(dtype), mask=mask)

    @triton.jit
    def reflect_pair_kernel(a_ptr, b_ptr, v_ptr, out_a_ptr, out_b_ptr, num_rows, num_cols, BLOCK: tl.constexpr):
        """Programs [0, num_rows) reflect rows of a, the next num_rows those of b (one launch per layer)."""
        pid = tl.program_id(0).to(tl.int64)
        if pid < num_rows:
            _reflect_row(a_ptr, v_ptr, out_a_ptr, pid, num_cols, BLOCK)
        else:
            _reflect_row(b_ptr, v_ptr, out_b_ptr, pid - num_rows, num_cols, BLOCK)


def normal_into(out: torch.Tensor, seeds: torch.Tensor, two_pi: float, u1_min: float) -> torch.Tensor:
    """out [S, n] (rows may be strided, columns contiguous) ← normal(seed_s, n), as rng.normal_into."""
    num_rows, n = out.shape
    if n == 0 or num_rows == 0:
        return out
    if out.stride(1) != 1:
        raise ValueError("columns of out must be contiguous")
    num_pairs = (n + 1) // 2
    seeds = seeds.to(device=out.device, dtype=torch.int64).reshape(-1).contiguous()
    block = 1024
    grid = (num_rows, triton.cdiv(num_pairs, block))
    normal_kernel[grid](out, seeds, out.stride(0), n, num_pairs, two_pi, u1_min, BLOCK=block,
                        enable_fp_fusion=False)
    return out


def can_reflect_rows(x: torch.Tensor, v: torch.Tensor) -> bool:
    return (available(x) and x.dtype in (torch.bfloat16, torch.float16) and v.ndim == 1
            and x.shape[-1] == v.shape[0] <= MAX_FUSED_HIDDEN and x.is_contiguous())


def reflect_rows(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """x [..., H] bf16/fp16 contiguous, v [H] → x − 2(x·v)v per row, a new tensor (see can_reflect_rows)."""
    return reflect_pair(x, x, v)[0]


def reflect_pair(a: torch.Tensor, b: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Both of a layer's outputs (hidden, residual: same shape and dtype) reflected in one launch.

    The hooks run between eager layers, so at small batches the host's launch cost, not the device, is what
    a reflection costs; one launch per layer instead of four torch ops per tensor keeps it off the critical path.
    """
    h = a.shape[-1]
    v = v.to(device=a.device, dtype=a.dtype)
    rows = a.numel() // h
    out_a = torch.empty_like(a)
    out_b = out_a if b is a else torch.empty_like(b)
    if rows:
        reflect_pair_kernel[(rows if b is a else 2 * rows,)](
            a, b, v, out_a, out_b, rows, h, BLOCK=triton.next_power_of_2(h), enable_fp_fusion=False)
    return out_a, out_b
