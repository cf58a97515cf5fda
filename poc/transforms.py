"""Vector transforms of PoC v2: Householder reflection, the k-dim pick, the Haar rotation, normalisation.

The per-layer reflection and steps 3–7 of the artifacts (docs/architecture.md, "PoC v2 artifacts, step by step"),
batched over nonces (one row per nonce). The pick reproduces the order in which CUDA `torch.topk(sorted=False)`
returns the chosen indices, explicitly and on every device, because CPU topk orders them differently and the order
is baked into the artifact bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from poc import cuda_kernels
from poc.errors import PocInputError
from poc.rng import murmur3_32, normal, seed_tensor
from poc.seeds import haar_seeds, pick_seeds

NORM_EPS = 1e-8
HAAR_EPS = 1e-30


def reflect(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Householder reflection x − 2(x·v)v over the last dim; v ([D] or [..., D]) is cast to x.dtype first.

    With a unit v this is an orthogonal involution. The cast matters for the layer hooks: the reference
    reflects bf16 activations with a bf16 copy of v, so the arithmetic happens in the activation dtype.
    """
    if cuda_kernels.can_reflect_rows(x, v):
        return cuda_kernels.reflect_rows(x, v)
    return reflect_torch(x, v)


def reflect_torch(x: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """reflect in plain torch ops: the reference the fused CUDA kernel must equal."""
    v = v.to(dtype=x.dtype, device=x.device)
    dot = (x * v).sum(dim=-1, keepdim=True)
    return x - 2 * dot * v


def reflect_add_rms_norm_torch(hidden: torch.Tensor, residual: torch.Tensor, v: torch.Tensor, weight: torch.Tensor,
                               eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Both of a layer's outputs reflected, then the next layer's fused add + RMSNorm as vLLM's CUDA kernel rounds
    it (the sum rounded to the dtype is the new residual; the fp32 sum of its squares gives the scale; the scaled
    value is rounded before the weight multiplies it): the definition cuda_kernels.reflect_add_rms_norm fuses."""
    z = reflect_torch(hidden, v) + reflect_torch(residual, v)
    zf = z.float()
    inv = torch.rsqrt(zf.pow(2).sum(dim=-1, keepdim=True) / zf.shape[-1] + eps)
    return (zf * inv).to(z.dtype) * weight.to(z.dtype), z


def normalize_rows(x: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """x / (‖x‖₂ + eps) per row; the epsilon is added to the norm, not to the squared norm."""
    return x / (x.norm(dim=-1, keepdim=True) + eps)


def topk_cuda_order(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k smallest scores per row [B, H] -> int64 [B, k], in CUDA topk(sorted=False) order.

    Order: indices whose score is strictly below the k-th smallest score, ascending by index, then the
    indices whose score equals it, ascending by index, cut at k; so the threshold element comes last.
    Implemented as a stable sort of a 3-class key (below / equal / above), which never depends on how the
    device's own topk orders its output.
    """
    num_cols = scores.shape[-1]
    if k <= 0 or k > num_cols:
        raise PocInputError("k_dim", f"must be in [1, {num_cols}], got {k}")
    kth = torch.topk(scores, k, dim=-1, largest=False).values.amax(dim=-1, keepdim=True)
    classes = (scores > kth).to(torch.int8) * 2 + (scores == kth).to(torch.int8)
    order = torch.sort(classes, dim=-1, stable=True).indices
    return order[..., :k].to(torch.int64)


def pick_scores(seeds: Sequence[int] | torch.Tensor, hidden_size: int, device: torch.device | str) -> torch.Tensor:
    """score[b, d] = murmur(d, seed_b) for d in 0..H-1: int64 [B, H]."""
    keys = torch.arange(hidden_size, dtype=torch.int64, device=device)
    return murmur3_32(keys, seed_tensor(seeds, device))


def pick_indices(
    block_hash: str,
    public_key: str,
    nonces: Sequence[int],
    hidden_size: int,
    k_dim: int,
    device: torch.device | str,
) -> torch.Tensor:
    """The k_dim chosen hidden dims of each nonce, in GPU order: int64 [B, k_dim] (artifact steps 4–5)."""
    if k_dim <= 0 or k_dim > hidden_size:
        raise PocInputError("k_dim", f"must be in [1, hidden_size={hidden_size}], got {k_dim}")
    seeds = pick_seeds(block_hash, public_key, nonces, k_dim)
    return topk_cuda_order(pick_scores(seeds, hidden_size, device), k_dim)


def haar_rotate_seeded(x: torch.Tensor, seeds_by_step: Sequence[Sequence[int]]) -> torch.Tensor:
    """Apply the k−1 seeded reflections to x [B, k]; `seeds_by_step[j][b]` seeds step j of row b.

    Each step: v = normal(seed, k), v ← v/(‖v‖ + 1e-30), y ← y − 2(y·v)v, all in float32 on x's device.
    """
    k = x.shape[-1]
    num_steps = len(seeds_by_step)
    if num_steps == 0:
        return x
    # All steps' vectors in one draw (each row depends only on its own seed): [steps, B, k].
    flat = [seed for step_seeds in seeds_by_step for seed in step_seeds]
    vs = normal(flat, k, x.device).view(num_steps, -1, k)
    vs = vs / (vs.norm(dim=-1, keepdim=True) + HAAR_EPS)
    y = x
    for v in vs:
        y = reflect(y, v)
    return y


def haar_rotate(
    x: torch.Tensor, block_hash: str, public_key: str, nonces: Sequence[int]
) -> torch.Tensor:
    """The per-nonce "Haar" rotation of x [B, k] (artifact step 6); row b belongs to nonces[b]."""
    if x.ndim != 2 or x.shape[0] != len(nonces):
        raise PocInputError("nonces", f"need one row per nonce, got x {tuple(x.shape)} for {len(nonces)} nonces")
    k = x.shape[1]
    if k <= 0:
        raise PocInputError("k_dim", f"must be positive, got {k}")
    return haar_rotate_seeded(x, haar_seeds(block_hash, public_key, nonces, k))
