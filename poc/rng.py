"""Counter-based RNG of PoC v2: the murmur3 variant, uniforms, Box–Muller normals and input embeddings.

What the fork's `gpu_random.py` computes (docs/architecture.md, "The network's contract"; tests/unit/test_poc_rng.py
pins its golden values). Everything is batched over seeds (one row per seed) and runs on whatever device is passed
in, so the prover (GPU) and a validator produce the same streams. Numerics follow the reference
`gpu_random.py` op for op: float32 throughout, and the cast to the model dtype happens per element as the
last step.

Memory: murmur needs int64 temporaries (8 bytes per element, several alive at once), so large draws are
tiled over (seed rows × pair columns) with at most `max_tile_pairs` pairs per tile; the only full-size
allocation is the output in its final dtype. Every op is elementwise, so tiling never changes a value.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence

import torch

from poc import cuda_kernels
from poc.errors import PocInputError
from poc.seeds import (
    NUM_SUB_SEEDS,
    householder_seed_string,
    input_seeds,
    input_sub_seeds,
    string_seed,
)

MASK32 = 0xFFFFFFFF
_C1 = 0xCC9E2D51
_C2 = 0x1B873593
_FMIX1 = 0x85EBCA6B
_FMIX2 = 0xC2B2AE35
_TWO_POW_32 = 4294967296.0
# The reference writes `2.0 * math.pi * u2`; torch evaluates a Python scalar against a float32 tensor in
# float32, so the constant that actually multiplies is 2π rounded to float32. Spelling that out keeps the
# value independent of how a future torch handles scalar promotion.
TWO_PI_F32 = struct.unpack("<f", struct.pack("<f", 2.0 * math.pi))[0]
U1_MIN = 1e-10
DEFAULT_MAX_TILE_PAIRS = 1 << 22


def host_to_device(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """A host tensor on `device` without waiting for the device: a plain `.to("cuda")` of pageable memory
    synchronises the stream, which would stall the host until every queued kernel (a whole forward) is done
    and leave the device idle while the host then launches the next steps. Pinned + non_blocking is safe:
    torch's pinned allocator keeps the source alive until the copy has run."""
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def seed_tensor(seeds: Sequence[int] | torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """Seeds as a 1-D int64 tensor on `device` (values are uint32, so int64 holds them exactly)."""
    if not isinstance(seeds, torch.Tensor):
        seeds = torch.tensor(list(seeds), dtype=torch.int64)
    return host_to_device(seeds.to(torch.int64).reshape(-1), device)


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x·c) mod 2^32 for x in [0, 2^32) without ever overflowing int64.

    A plain int64 product of two 32-bit values can exceed 2^63; splitting c into 16-bit halves keeps every
    intermediate below 2^49, so the result never relies on signed-overflow wrapping.
    """
    lo = x * (c & 0xFFFF)
    hi = (x * (c >> 16)).bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    return lo.add_(hi).bitwise_and_(MASK32)


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return (x << r).bitwise_or_(x >> (32 - r)).bitwise_and_(MASK32)


def murmur3_32(keys: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """The PoC murmur3 variant of every key under every seed: keys [K], seeds [S] -> int64 [S, K].

    MurmurHash3_x86_32 of one 4-byte block with the `h ^= length` step left out, as the fork's.
    Results are uint32 values held in int64.
    """
    k = keys.to(torch.int64).reshape(-1) & MASK32
    k = _mul32(k, _C1)
    k = _rotl32(k, 15)
    k = _mul32(k, _C2)
    h = (seeds.to(torch.int64).reshape(-1, 1) & MASK32) ^ k.unsqueeze(0)
    h = _rotl32(h, 13)
    h = h.mul_(5).add_(0xE6546B64).bitwise_and_(MASK32)
    h ^= h >> 16
    h = _mul32(h, _FMIX1)
    h ^= h >> 13
    h = _mul32(h, _FMIX2)
    h ^= h >> 16
    return h


def uniform_keys(keys: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
    """u = float32(murmur(key, seed)) / 2^32 for each key, one row per seed: float32 [S, len(keys)]."""
    # int64 -> float32 rounds to nearest (CPU cvtsi2ss, CUDA __ll2float_rn), so u can be exactly 1.0;
    # dividing by 2^32 is exact.
    return murmur3_32(keys, seeds).to(torch.float32).div_(_TWO_POW_32)


def _box_muller_tile(
    seeds: torch.Tensor, start: int, stop: int, num_pairs: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pairs [start, stop) of every seed row: (cos half, sin half), each float32 [S, stop - start]."""
    keys = torch.arange(start, stop, dtype=torch.int64, device=seeds.device)
    u1 = uniform_keys(keys, seeds).clamp_min_(U1_MIN)
    u2 = uniform_keys(keys + num_pairs, seeds)
    r = torch.sqrt(-2.0 * torch.log(u1))
    theta = u2.mul_(TWO_PI_F32)
    return r * torch.cos(theta), r * torch.sin(theta)


def normal_into(
    out: torch.Tensor,
    seeds: torch.Tensor,
    max_tile_pairs: int = DEFAULT_MAX_TILE_PAIRS,
) -> torch.Tensor:
    """Fill `out` [S, n] (any float dtype, may be a column slice) with normal(seed_s, n) per row; returns out.

    Layout (the fork's): with P = ceil(n/2), column i < P is the cos half of pair i and column P+i the sin
    half of pair i (not interleaved); the last sin value is dropped when n is odd. Values are computed in
    float32 and rounded to out.dtype on store, which equals casting a full float32 result at the end.
    """
    if cuda_kernels.available(out) and out.stride(-1) == 1:
        return cuda_kernels.normal_into(out, seeds, TWO_PI_F32, U1_MIN)
    return normal_into_torch(out, seeds, max_tile_pairs)


def normal_into_torch(
    out: torch.Tensor,
    seeds: torch.Tensor,
    max_tile_pairs: int = DEFAULT_MAX_TILE_PAIRS,
) -> torch.Tensor:
    """normal_into in plain torch ops on any device: the reference the fused CUDA kernel must equal."""
    num_rows, n = out.shape
    if n == 0 or num_rows == 0:
        return out
    seeds = seeds.to(device=out.device, dtype=torch.int64).reshape(-1)
    num_pairs = (n + 1) // 2
    cols = max(1, min(num_pairs, max_tile_pairs))
    rows = max(1, max_tile_pairs // cols)
    for r0 in range(0, num_rows, rows):
        r1 = min(num_rows, r0 + rows)
        for c0 in range(0, num_pairs, cols):
            c1 = min(num_pairs, c0 + cols)
            z0, z1 = _box_muller_tile(seeds[r0:r1], c0, c1, num_pairs)
            out[r0:r1, c0:c1] = z0
            sin_stop = min(n, num_pairs + c1)
            if num_pairs + c0 < sin_stop:
                out[r0:r1, num_pairs + c0 : sin_stop] = z1[:, : sin_stop - num_pairs - c0]
    return out


def normal(
    seeds: Sequence[int] | torch.Tensor,
    n: int,
    device: torch.device | str,
    max_tile_pairs: int = DEFAULT_MAX_TILE_PAIRS,
) -> torch.Tensor:
    """normal(seed, n) for every seed at once: float32 [S, n]; row s is bit-identical to a lone draw."""
    seeds_t = seed_tensor(seeds, device)
    out = torch.empty(seeds_t.numel(), n, dtype=torch.float32, device=device)
    return normal_into(out, seeds_t, max_tile_pairs)


def _output_buffer(
    out: torch.Tensor | None,
    num_nonces: int,
    seq_len: int,
    hidden_size: int,
    device: torch.device | str,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Checks the batch shape and returns a [B, L·H] view to fill: of `out` if given, else a fresh buffer."""
    if num_nonces == 0:
        raise PocInputError("nonces", "nonce list is empty")
    if seq_len <= 0:
        raise PocInputError("seq_len", f"must be positive, got {seq_len}")
    if hidden_size <= 0:
        raise PocInputError("hidden_size", f"must be positive, got {hidden_size}")
    if out is None:
        return torch.empty(num_nonces, seq_len * hidden_size, dtype=dtype, device=device)
    if tuple(out.shape) != (num_nonces, seq_len, hidden_size) or not out.is_contiguous():
        want = (num_nonces, seq_len, hidden_size)
        raise PocInputError("out", f"need a contiguous {want} tensor, got {tuple(out.shape)}")
    return out.view(num_nonces, seq_len * hidden_size)


def standard_inputs(
    seeds: Sequence[int] | torch.Tensor,
    seq_len: int,
    hidden_size: int,
    device: torch.device | str,
    dtype: torch.dtype,
    max_tile_pairs: int = DEFAULT_MAX_TILE_PAIRS,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Standard input embeddings: row b = normal(seed_b, L·H) viewed row-major as [L, H]; [B, L, H] dtype.

    `out`, if given, is a contiguous [B, L, H] buffer to fill (its dtype wins over `dtype`).
    """
    seeds_t = seed_tensor(seeds, device)
    flat = _output_buffer(out, seeds_t.numel(), seq_len, hidden_size, device, dtype)
    normal_into(flat, seeds_t, max_tile_pairs)
    return flat.view(-1, seq_len, hidden_size)


def stronger_inputs(
    sub_seed_rows: Sequence[Sequence[int]] | torch.Tensor,
    seq_len: int,
    hidden_size: int,
    device: torch.device | str,
    dtype: torch.dtype,
    max_tile_pairs: int = DEFAULT_MAX_TILE_PAIRS,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """"Concat-murmur" inputs (the fork's stronger RNG): 8 segments of ceil(N/8), segment j = normal(s_j, its
    length).

    `sub_seed_rows` is [B, 8]. Each segment does its own cos/sin split, so this differs from the standard
    generator even in segment 0. Segments that would start at or past N are skipped. `out` as above.
    """
    subs = host_to_device(torch.as_tensor(sub_seed_rows, dtype=torch.int64), device).reshape(-1, NUM_SUB_SEEDS)
    flat = _output_buffer(out, subs.shape[0], seq_len, hidden_size, device, dtype)
    total = seq_len * hidden_size
    seg_len = (total + NUM_SUB_SEEDS - 1) // NUM_SUB_SEEDS
    for j in range(NUM_SUB_SEEDS):
        start = j * seg_len
        if start >= total:
            break
        stop = min(total, start + seg_len)
        normal_into(flat[:, start:stop], subs[:, j], max_tile_pairs)
    return flat.view(-1, seq_len, hidden_size)


def input_embeddings(
    block_hash: str,
    public_key: str,
    nonces: Sequence[int],
    seq_len: int,
    hidden_size: int,
    device: torch.device | str,
    dtype: torch.dtype,
    stronger_rng: bool = False,
    max_tile_pairs: int = DEFAULT_MAX_TILE_PAIRS,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The PoC inputs_embeds for a batch of nonces: [B, L, H] in the model dtype, nonce order kept.

    `out`, if given, is a contiguous [B, L, H] buffer to fill instead of allocating one; either way the
    stronger flag is honoured (the fork's scratchpad path silently ignored it).
    """
    if len(nonces) == 0:
        raise PocInputError("nonces", "nonce list is empty")
    if stronger_rng:
        subs = input_sub_seeds(block_hash, public_key, nonces)
        return stronger_inputs(subs, seq_len, hidden_size, device, dtype, max_tile_pairs, out)
    seeds = input_seeds(block_hash, public_key, nonces)
    return standard_inputs(seeds, seq_len, hidden_size, device, dtype, max_tile_pairs, out)


def householder_vectors(
    block_hash: str, num_layers: int, hidden_size: int, device: torch.device | str
) -> torch.Tensor:
    """Unit float32 vectors of layers 0..num_layers-1, stacked [num_layers, H]: layer i's is
    normal(S(householder string of i), H) / ‖·‖, with no epsilon, as the fork's."""
    if num_layers < 0:
        raise PocInputError("num_layers", f"must be non-negative, got {num_layers}")
    if num_layers == 0:
        return torch.empty(0, hidden_size, dtype=torch.float32, device=device)
    if hidden_size <= 0:
        raise PocInputError("hidden_size", f"must be positive, got {hidden_size}")
    seeds = [string_seed(householder_seed_string(block_hash, i)) for i in range(num_layers)]
    # One batched draw (each row depends only on its seed), then a 1-D norm per layer as the reference does: a
    # batched row norm may reduce in another order and differ in the last bit.
    raw = normal(seeds, hidden_size, device)
    return torch.stack([v / v.norm() for v in raw])
