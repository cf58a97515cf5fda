"""What a batch of artifacts is computed from, typed once: the round's inputs (PocSpec) and a unit of work."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.poc import DEFAULT_K_DIM, Encoding
from protocol.pow import NodeIdentity, PowParams


@dataclass(frozen=True)
class PocSpec:
    """Everything besides the nonce (and the model) that decides an artifact: seeds, sequence length, k, RNG."""

    block_hash: str
    public_key: str
    seq_len: int
    k_dim: int = DEFAULT_K_DIM
    stronger_rng: bool = False

    @classmethod
    def of(cls, node: NodeIdentity, params: PowParams, stronger_rng: bool) -> PocSpec:
        return cls(node.block_hash, node.public_key, params.seq_len, params.k_dim, stronger_rng)

    @property
    def encoding(self) -> Encoding:
        return Encoding(k_dim=self.k_dim)


@dataclass(frozen=True)
class ArtifactJob:
    """Artifacts to compute: one spec, explicit nonces (run as one or more forwards)."""

    spec: PocSpec
    nonces: tuple[int, ...]


@dataclass(frozen=True)
class ForwardBatch:
    """One forward as every worker receives it (the one argument of its RPC): the spec, the nonces, and the KV
    blocks the engine thread leased for it."""

    spec: PocSpec
    nonces: tuple[int, ...]
    block_ids: tuple[int, ...]
