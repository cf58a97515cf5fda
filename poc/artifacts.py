"""PoC v2 artifacts: last hidden states -> (kept nonces, fp16 vectors) -> `vector_b64` strings.

The steps of docs/architecture.md ("The network's contract", PoC v2 artifacts step by step) in exact order,
with the NaN policy of the fork's qd/combine branch (NaN rows dropped) widened to every non-finite value: a row
that is not finite is dropped before normalisation and again after the fp16 cast, and its nonce simply
vanishes from the output (it still counted as processed upstream). Inf is treated like NaN because an Inf
row would only turn into NaN at normalisation anyway; dropping it early says so plainly.
"""

from __future__ import annotations

import base64
import binascii
import operator
from collections.abc import Sequence

import numpy as np
import torch

from poc.errors import PocInputError
from poc.transforms import haar_rotate, normalize_rows, pick_indices

DEFAULT_K_DIM = 12
# Wire encoding of a vector: IEEE fp16, little-endian, standard base64 with padding.
WIRE_DTYPE = np.dtype("<f2")


def _finite_rows(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x).all(dim=-1)


def _keep_rows(
    x: torch.Tensor, nonces: list[int], keep: torch.Tensor
) -> tuple[torch.Tensor, list[int]]:
    keep_list = keep.tolist()
    if all(keep_list):
        return x, nonces
    index = torch.nonzero(keep, as_tuple=True)[0]
    return x.index_select(0, index), [n for n, k in zip(nonces, keep_list, strict=False) if k]


def compute_artifact_vectors(
    last_hidden: torch.Tensor,
    block_hash: str,
    public_key: str,
    nonces: Sequence[int],
    k_dim: int = DEFAULT_K_DIM,
) -> tuple[list[int], torch.Tensor]:
    """Steps 1–8 (module docstring) on last_hidden [B, H]; returns (kept nonces, fp16 vectors [B', k_dim]).

    Runs on last_hidden's device. Row b belongs to nonces[b]; output rows keep that order. An all-bad
    batch gives ([], an empty [0, k_dim] fp16 tensor).
    """
    if last_hidden.ndim != 2:
        raise PocInputError("last_hidden", f"must be [batch, hidden], got shape {tuple(last_hidden.shape)}")
    num_rows, hidden_size = last_hidden.shape
    nonce_list = [operator.index(n) for n in nonces]
    if not nonce_list:
        raise PocInputError("nonces", "nonce list is empty")
    if len(nonce_list) != num_rows:
        raise PocInputError("nonces", f"{len(nonce_list)} nonces for {num_rows} hidden rows")
    if k_dim <= 0 or k_dim > hidden_size:
        raise PocInputError("k_dim", f"must be in [1, hidden_size={hidden_size}], got {k_dim}")
    device = last_hidden.device

    h = last_hidden.to(torch.float32)
    finite = _finite_rows(h)
    # Every step below works row by row, so a non-finite row simply rides along and both filters are applied
    # once at the end: the kept rows' values are what dropping the bad rows first would give, and the device
    # is synchronised once per batch instead of after the forward (which left it idle while this launched).
    h = normalize_rows(h)
    chosen = pick_indices(block_hash, public_key, nonce_list, hidden_size, k_dim, device)
    x_k = torch.gather(h, 1, chosen)
    y = normalize_rows(haar_rotate(x_k, block_hash, public_key, nonce_list))
    # .half() rounds to nearest-even on every device, matching the reference's `.half()`.
    vectors = y.half()
    vectors, nonce_list = _keep_rows(vectors, nonce_list, finite & _finite_rows(vectors))
    return nonce_list, vectors


def decode_vector(vector_b64: str) -> np.ndarray:
    """base64 -> `<f2` -> float32 1-D array; raises PocInputError("vector_b64", ...) on malformed input.

    Decoding is strict (non-alphabet characters are an error, not skipped), and an odd byte count is an
    error because it cannot be a whole number of fp16 values.
    """
    try:
        data = base64.b64decode(vector_b64, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise PocInputError("vector_b64", f"not valid base64: {exc}") from exc
    if len(data) % WIRE_DTYPE.itemsize:
        raise PocInputError("vector_b64", f"{len(data)} bytes is not a whole number of fp16 values")
    return np.frombuffer(data, dtype=WIRE_DTYPE).astype(np.float32)


def vector_l2(a_b64: str, b_b64: str) -> float:
    """L2 distance between two wire vectors (the distance validation compares to its threshold)."""
    return float(np.linalg.norm(decode_vector(a_b64) - decode_vector(b_b64)))


def encode_vectors(vectors: torch.Tensor) -> list[str]:
    """fp16 vectors [B, k] -> one base64 string per row (a single device-to-host copy)."""
    host = vectors.detach().to("cpu", torch.float16).numpy().astype(WIRE_DTYPE, copy=False)
    return [base64.b64encode(row.tobytes()).decode("ascii") for row in host]


def compute_artifacts(
    last_hidden: torch.Tensor,
    block_hash: str,
    public_key: str,
    nonces: Sequence[int],
    k_dim: int = DEFAULT_K_DIM,
) -> list[tuple[int, str]]:
    """The wire artifacts of one batch: [(nonce, vector_b64)] for every kept nonce, in nonce order."""
    kept, vectors = compute_artifact_vectors(last_hidden, block_hash, public_key, nonces, k_dim)
    return list(zip(kept, encode_vectors(vectors), strict=False))
