"""Seed strings and string-to-seed hashing for PoC v2 (pinned by tests/unit/test_poc_seeds.py).

Every random stream in PoC v2 is keyed by a uint32 derived from a fixed string; the string formats are part
of the consensus contract, so they live here and nowhere else. Nonces are written as Python decimal ints
(a negative nonce keeps its leading "-"); strings are used byte-for-byte, never normalised.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

NUM_SUB_SEEDS = 8


def string_seed(seed_string: str) -> int:
    """S(s): the first 4 bytes of SHA-256(UTF-8 s) read as a big-endian uint32."""
    digest = hashlib.sha256(seed_string.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big")


def sub_seeds(seed_string: str) -> tuple[int, ...]:
    """The 8 big-endian uint32 words of SHA-256(UTF-8 s), for the stronger RNG; element 0 equals S(s)."""
    digest = hashlib.sha256(seed_string.encode("utf-8")).digest()
    return tuple(int.from_bytes(digest[4 * j : 4 * j + 4], "big") for j in range(NUM_SUB_SEEDS))


# The `:d` format rejects floats and strings, so a nonce that slipped past the edge as 5.0 cannot
# silently hash as "5.0" and produce artifacts nobody else can reproduce.


def input_seed_string(block_hash: str, public_key: str, nonce: int) -> str:
    """Input-embedding seed string; note: no underscore between "nonce" and the number."""
    return f"{block_hash}_{public_key}_nonce{nonce:d}"


def householder_seed_string(block_hash: str, layer_index: int) -> str:
    """Per-layer Householder seed string; it has no public key, so every node in a round shares it."""
    return f"{block_hash}_layer_{layer_index:d}_householder"


def pick_seed_string(block_hash: str, public_key: str, nonce: int, k_dim: int) -> str:
    """k-dim pick seed string (underscore after "nonce", unlike the input string)."""
    return f"{block_hash}_{public_key}_nonce_{nonce:d}_pick_{k_dim:d}"


def haar_seed_string(block_hash: str, public_key: str, nonce: int, k_dim: int, step: int) -> str:
    """Seed string of Haar reflection `step` (0..k_dim-2)."""
    return f"{block_hash}_{public_key}_nonce_{nonce:d}_haar_hh_{k_dim:d}_{step:d}"


def input_seeds(block_hash: str, public_key: str, nonces: Sequence[int]) -> list[int]:
    """S of each nonce's input-embedding string, in nonce order."""
    return [string_seed(input_seed_string(block_hash, public_key, n)) for n in nonces]


def input_sub_seeds(block_hash: str, public_key: str, nonces: Sequence[int]) -> list[tuple[int, ...]]:
    """The 8 stronger-RNG sub-seeds of each nonce's input-embedding string, in nonce order."""
    return [sub_seeds(input_seed_string(block_hash, public_key, n)) for n in nonces]


def pick_seeds(block_hash: str, public_key: str, nonces: Sequence[int], k_dim: int) -> list[int]:
    """S of each nonce's pick string, in nonce order."""
    return [string_seed(pick_seed_string(block_hash, public_key, n, k_dim)) for n in nonces]


def haar_seeds(block_hash: str, public_key: str, nonces: Sequence[int], k_dim: int) -> list[list[int]]:
    """Haar seeds indexed [step][nonce]: one row per reflection, so each step is one batched draw."""
    return [
        [string_seed(haar_seed_string(block_hash, public_key, n, k_dim, j)) for n in nonces]
        for j in range(k_dim - 1)
    ]
