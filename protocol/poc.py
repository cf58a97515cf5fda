"""Wire structs for PoC v2 artifact computation. Wire structs only, no logic."""

from __future__ import annotations

import msgspec

from protocol.common import ErrorInfo

# k_dim when a request does not say: the fork's default.
DEFAULT_K_DIM = 12


class Artifact(msgspec.Struct, kw_only=True):
    nonce: int
    # fp16 little-endian vector, standard base64 (poc/artifacts.py).
    vector_b64: str


class Encoding(msgspec.Struct, kw_only=True):
    """How `vector_b64` is encoded, as every artifact list states it (the fork's `encoding` field)."""

    dtype: str = "f16"
    k_dim: int = DEFAULT_K_DIM
    endian: str = "le"


class PocArtifactsRequest(msgspec.Struct, tag="poc.artifacts", kw_only=True):
    """Compute artifacts for explicit nonces between engine steps (no mining round, no callbacks)."""

    rid: str
    block_hash: str
    public_key: str
    nonces: list[int]
    seq_len: int
    k_dim: int = DEFAULT_K_DIM
    stronger_rng: bool = False


class PocArtifactsReply(msgspec.Struct, tag="poc.artifacts_done", kw_only=True):
    rid: str
    # In request order; nonces whose hidden state was not finite are missing (poc/artifacts.py drops them).
    artifacts: list[Artifact] = []
    error: ErrorInfo | None = None
