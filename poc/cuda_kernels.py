"""Fused CUDA (Triton) versions of the PoC hot loops, value-for-value equal to the torch reference.

The torch code in poc/rng.py and poc/transforms.py is the definition; these kernels only fuse it:
- `normal_into`: murmur3 → uniforms → Box–Muller → cast, one kernel instead of ~70 full-size int64 passes
  (8 ms of a 32×1024 batch on an H100). Integer math is exact in any order; the float steps use the same
  correctly rounded operations as torch's CUDA kernels (libdevice logf/cosf/sinf, sqrt.rn, one rounding per
  multiply), so every value is bit-identical (tests/unit/test_poc_cuda.py checks it on a GPU).
- `reflect_rows`: the per-layer Householder reflection x − 2(x·v)v of bf16/fp16 activations in one pass,
  with the reference's roundings (product, dot, 2·dot·v and the difference each rounded to the activation
  dtype). Only the fp32 summation order inside the dot differs from torch's reduction, as it does between any
  two GPUs' reductions, so a dot can differ in its last bit (seen for fp16, never for bf16 on an H100).
- `reflect_add_rms_norm`: the reflection of a layer's output pair fused into the next layer's add + RMSNorm
  (poc/transforms.py reflect_add_rms_norm_torch is its definition): the reflected values are `reflect_rows`' own.

All launch with enable_fp_fusion=False: Triton otherwise contracts x − (2·dot)·v into one FMA and skips the
rounding of the product, which changed about 5% of the reflected bf16 values.

Used only for CUDA tensors when Triton imports (`available()`); POCSERVE_POC_TRITON=0 turns them off. The
reflection's launches after a shape's first skip Triton's per-call work (`DirectLaunch`); POCSERVE_POC_TRITON_DIRECT=0
keeps every launch on Triton's own path.
"""

import functools
import logging
import os

import torch

log = logging.getLogger(__name__)

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
    def _reflected(x, v, dtype: tl.constexpr):
        """x − 2(x·v)v of one row (x, v: fp32 holding activation-dtype values), in the activation dtype."""
        prod = (x * v).to(dtype).to(tl.float32)             # torch: x * v in the activation dtype
        dot = tl.sum(prod, axis=0).to(dtype).to(tl.float32)  # .sum(): fp32 accumulation, one rounding
        scaled = (dot * 2.0).to(dtype).to(tl.float32)        # 2 * dot
        update = (scaled * v).to(dtype).to(tl.float32)       # (2·dot) * v
        return (x - update).to(dtype)

    @triton.jit
    def _reflect_row(x_ptr, v_ptr, out_ptr, row, num_cols, BLOCK: tl.constexpr):
        cols = tl.arange(0, BLOCK)
        mask = cols < num_cols
        dtype = out_ptr.dtype.element_ty
        x = tl.load(x_ptr + row * num_cols + cols, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + row * num_cols + cols, _reflected(x, v, dtype), mask=mask)

    @triton.jit
    def reflect_pair_kernel(a_ptr, b_ptr, v_ptr, out_a_ptr, out_b_ptr, num_rows, num_cols, BLOCK: tl.constexpr):
        """Programs [0, num_rows) reflect rows of a, the next num_rows those of b (one launch per layer)."""
        pid = tl.program_id(0).to(tl.int64)
        if pid < num_rows:
            _reflect_row(a_ptr, v_ptr, out_a_ptr, pid, num_cols, BLOCK)
        else:
            _reflect_row(b_ptr, v_ptr, out_b_ptr, pid - num_rows, num_cols, BLOCK)


    @triton.jit
    def reflect_add_norm_kernel(h_ptr, r_ptr, v_ptr, w_ptr, out_ptr, res_ptr, num_cols, eps, BLOCK: tl.constexpr):
        """One row of a layer's output pair reflected (as _reflect_row) and then vLLM's fused_add_rms_norm CUDA
        kernel on it (csrc/layernorm_kernels.cu): z = h + r rounded to the dtype is the new residual; the output is
        (z·rsqrt(Σz²/H + eps)) rounded, times the weight, rounded."""
        row = tl.program_id(0).to(tl.int64)
        cols = tl.arange(0, BLOCK)
        mask = cols < num_cols
        dtype = out_ptr.dtype.element_ty
        at = row * num_cols + cols
        v = tl.load(v_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        h = _reflected(tl.load(h_ptr + at, mask=mask, other=0.0).to(tl.float32), v, dtype).to(tl.float32)
        r = _reflected(tl.load(r_ptr + at, mask=mask, other=0.0).to(tl.float32), v, dtype).to(tl.float32)
        z = (h + r).to(dtype)
        tl.store(res_ptr + at, z, mask=mask)
        zf = z.to(tl.float32)
        inv = tl.math.rsqrt(tl.sum(zf * zf, axis=0) / num_cols + eps)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + at, ((zf * inv).to(dtype).to(tl.float32) * w).to(dtype), mask=mask)


def _int_class(value: int) -> tuple[bool, bool, bool]:
    """What Triton specialises an integer argument on: equal to 1, a multiple of 16, fits in 32 bits."""
    return value == 1, value % 16 == 0, -(2**31) <= value < 2**31


def _tensor_class(t: torch.Tensor) -> tuple:
    """What Triton specialises a tensor argument on: its dtype and the 16-byte alignment of its address."""
    return t.dtype, t.data_ptr() % 16 == 0


class DirectLaunch:
    """Launches of one @triton.jit kernel that skip Triton's per-call work after a specialisation's first.

    Why: JITFunction.run binds the arguments, computes their specialisation and cache key, checks globals and
    parses the options on every call, then calls the compiled kernel's launcher; the eager PoC forward (every TP > 1
    node's, and any forward paced beside chat) launches one per layer from the engine thread. On an H200 host a
    launch took 20.2 us of host time that way and 15.0 directly (bench/triton_launch.py, docs/benchmarks-history.md,
    2026-12-02 night).

    How: the first launch of a key goes through Triton, which returns the CompiledKernel it ran; the key holds
    everything Triton specialises these kernels on (dtypes, each pointer's 16-byte alignment, each integer's
    class). Later launches with that key call the kernel's launcher exactly as JITFunction.run does (Triton
    3.4-3.6: `kernel.run(grid, stream, function, packed metadata, launch metadata, hooks, *args)`), so the same
    machine code runs on the same arguments. Once per key the direct launch is checked against Triton's own, bit
    for bit, into scratch outputs (one sync); any difference or error turns the direct path off for the process.
    Never while a CUDA graph is being captured (graphs.py): a sync there would end the capture, so a key first met
    inside one goes through Triton's path until it is met outside.
    """

    def __init__(self, kernel, outputs: tuple[int, ...], **options) -> None:
        self.kernel, self.outputs, self.options = kernel, outputs, options
        self._compiled: dict[tuple, object] = {}
        self.off_reason: str | None = None
        knobs = getattr(triton, "knobs", None)
        if os.environ.get("POCSERVE_POC_TRITON_DIRECT", "1") == "0":
            self.off_reason = "POCSERVE_POC_TRITON_DIRECT=0"
        elif knobs is None or not hasattr(getattr(knobs, "runtime", None), "launch_enter_hook"):
            self.off_reason = f"triton {getattr(triton, '__version__', '?')} has no knobs.runtime (before 3.4)"

    def __call__(self, key: tuple, grid: tuple[int, ...], *args) -> None:
        compiled = self._compiled.get(key)
        if compiled is not None and self.off_reason is None:
            self._run(compiled, grid, args)
            return
        compiled = self.kernel[grid](*args, **self.options)
        if self.off_reason is None and key not in self._compiled and not torch.cuda.is_current_stream_capturing():
            self._check(key, compiled, grid, args)

    @staticmethod
    def _run(compiled, grid: tuple[int, ...], args: tuple) -> None:
        from triton.runtime.driver import driver
        stream = driver.active.get_current_stream(driver.active.get_current_device())
        g0, g1, g2 = (*grid, 1, 1)[:3]
        hooks = triton.knobs.runtime
        compiled.run(g0, g1, g2, stream, compiled.function, compiled.packed_metadata,
                     compiled.launch_metadata(grid, stream, *args), hooks.launch_enter_hook,
                     hooks.launch_exit_hook, *args)

    def _check(self, key: tuple, compiled, grid: tuple[int, ...], args: tuple) -> None:
        """The direct launch of `compiled` into fresh outputs equals Triton's launch just made; kept if so."""
        try:
            scratch = list(args)
            fresh: dict[int, torch.Tensor] = {}
            for i in self.outputs:  # an output passed twice (reflect_rows: out_b is out_a) stays one tensor
                scratch[i] = fresh.setdefault(id(args[i]), torch.empty_like(args[i]))
            self._run(compiled, grid, tuple(scratch))
            same = all(torch.equal(args[i], scratch[i]) for i in self.outputs)  # syncs: once per key
        except Exception as e:  # an API this launcher does not know: Triton's own path from now on
            same, why = False, f"{type(e).__name__}: {e}"[:200]
        else:
            why = "its outputs differ from Triton's own launch"
        if same:
            self._compiled[key] = compiled
        else:
            self.off_reason = why
            log.warning("poc_triton_direct_off: %s", why)


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
    if v.dtype != a.dtype or v.device != a.device:
        v = v.to(device=a.device, dtype=a.dtype)
    rows = a.numel() // h
    out_a = torch.empty_like(a)
    same = b is a
    out_b = out_a if same else torch.empty_like(b)
    if rows:
        block = _next_power_of_2(h)
        key = (same, _tensor_class(a), _tensor_class(b), _tensor_class(v), _tensor_class(out_a),
               _tensor_class(out_b), _int_class(rows), _int_class(h), block)
        _reflect_pair_launch()(key, (rows if same else 2 * rows,), a, b, v, out_a, out_b, rows, h, block)
    return out_a, out_b


def can_reflect_into_norm(hidden: torch.Tensor, residual: torch.Tensor, v: torch.Tensor,
                          weight: torch.Tensor) -> bool:
    """reflect_add_rms_norm takes these: a layer's output pair and the next norm's weight, all of one dtype."""
    return (can_reflect_rows(hidden, v) and residual.shape == hidden.shape and residual.is_contiguous()
            and residual.dtype == hidden.dtype == weight.dtype == v.dtype and residual.device == hidden.device
            and weight.shape == v.shape and weight.is_contiguous() and v.is_contiguous())


def reflect_add_rms_norm(hidden: torch.Tensor, residual: torch.Tensor, v: torch.Tensor, weight: torch.Tensor,
                         eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """A layer's output pair reflected with v, then the next layer's fused add + RMSNorm, in one pass: (normed,
    new residual), as reflect_pair followed by vLLM's fused_add_rms_norm (see can_reflect_into_norm).

    Why: the reflection alone reads and writes both tensors once more per layer (2-3% of a forward at memory
    speed, all of what PoC then costs over the bare forward); here it rides on the norm's own pass. The
    reflected values are reflect_pair's bit for bit; the norm's fp32 sum of squares is reduced in another order
    than vLLM's, so an output can differ from vLLM's kernel in its last bit."""
    h = hidden.shape[-1]
    rows = hidden.numel() // h
    out, new_residual = torch.empty_like(hidden), torch.empty_like(residual)
    if rows:
        block = _next_power_of_2(h)
        key = (_tensor_class(hidden), _tensor_class(residual), _tensor_class(v), _tensor_class(weight),
               _tensor_class(out), _tensor_class(new_residual), _int_class(h), block)
        _reflect_norm_launch(min(max(block // 256, 1), 8))(key, (rows,), hidden, residual, v, weight, out,
                                                            new_residual, h, float(eps), block)
    return out, new_residual


@functools.cache
def _next_power_of_2(n: int) -> int:
    return triton.next_power_of_2(n)


@functools.cache
def _reflect_pair_launch() -> DirectLaunch:
    # The outputs (out_a, out_b) are arguments 3 and 4. With a == b the kernel writes out_a only (out_b is it).
    return DirectLaunch(reflect_pair_kernel, outputs=(3, 4), enable_fp_fusion=False)


@functools.cache
def _reflect_norm_launch(num_warps: int) -> DirectLaunch:
    # Outputs (out, new residual) are arguments 4 and 5; the warps as Triton's own layer-norm example picks them.
    return DirectLaunch(reflect_add_norm_kernel, outputs=(4, 5), enable_fp_fusion=False, num_warps=num_warps)
