"""Validation math of PoC v2 (the fork's; docs/architecture.md, "The network's contract"): per-artifact mismatch,
the binomial fraud test, the result dict, and the network validator's rule for nonces it could not score (the
gonka_poc plugin's; docs/decisions.md, "Nonces a validator cannot score").

Pure functions over already-computed artifacts; the recomputation itself happens in the worker. The
statistics parameters travel as a frozen `StatTest`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from scipy.stats import binomtest

from poc.artifacts import decode_vector
from poc.errors import PocInputError


@dataclass(frozen=True)
class StatTest:
    """Validation parameters; defaults are the reference code defaults (chain params override them)."""

    dist_threshold: float = 0.02
    p_mismatch: float = 0.001
    fraud_threshold: float = 0.01

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise PocInputError(f.name, f"must be a finite number, got {value!r}")
            object.__setattr__(self, f.name, float(value))
        if self.dist_threshold < 0:
            raise PocInputError("dist_threshold", f"must be >= 0, got {self.dist_threshold}")
        for name in ("p_mismatch", "fraud_threshold"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise PocInputError(name, f"must be in [0, 1], got {getattr(self, name)}")


def is_mismatch(computed: np.ndarray, received_b64: str, k_dim: int, dist_threshold: float) -> bool:
    """Whether one received vector fails against the computed fp16-decoded vector.

    Mismatch when the received vector is undecodable, its shape is not (k_dim,), any value is non-finite,
    or L2(computed − received) > dist_threshold (strictly). An undecodable vector cannot have shape (k_dim,),
    so it counts as a shape mismatch instead of failing the whole validation.
    """
    try:
        received = decode_vector(received_b64)
    except PocInputError:
        return True
    if received.shape != (k_dim,):
        return True
    if not np.all(np.isfinite(received)):
        return True
    distance = float(np.linalg.norm(np.asarray(computed, dtype=np.float32) - received))
    return distance > float(dist_threshold)


def find_mismatches(
    computed: Sequence[tuple[int, str]],
    validation_map: Mapping[int, str],
    k_dim: int,
    dist_threshold: float,
) -> list[int]:
    """Mismatching nonces in computation order; artifacts with no or an empty received entry are skipped."""
    mismatch_nonces: list[int] = []
    for nonce, computed_b64 in computed:
        received_b64 = validation_map.get(nonce)
        if not received_b64:
            continue
        if is_mismatch(decode_vector(computed_b64), received_b64, k_dim, dist_threshold):
            mismatch_nonces.append(nonce)
    return mismatch_nonces


def fraud_test(
    n_mismatch: int, n_total: int, p_mismatch: float, fraud_threshold: float
) -> tuple[float, bool]:
    """One-sided binomial test: p = P[X ≥ n_mismatch], X ~ Bin(n_total, p_mismatch); fraud iff p < threshold."""
    if n_total == 0:
        return 1.0, False
    if not 0 <= n_mismatch <= n_total:
        raise PocInputError("n_mismatch", f"must be in [0, n_total={n_total}], got {n_mismatch}")
    p_value = float(binomtest(k=n_mismatch, n=n_total, p=p_mismatch, alternative="greater").pvalue)
    return p_value, p_value < fraud_threshold


# A requested nonce the validator could not score (its hidden state was not finite, so poc/artifacts.py dropped the
# row) is evidence neither way: it leaves the sample and the verdict is over the nonces scored, as the network's
# validator does (the gonka_poc plugin the ML node runs; docs/decisions.md, "Nonces a validator cannot score").
# Past this share of the request the validator itself is suspect and gives no verdict.
MAX_UNSCORED_FRACTION = 0.1


def unscored_nonces(request_nonces: Sequence[int], computed_nonces: Sequence[int]) -> list[int]:
    """The requested nonces (each occurrence) that came back without an artifact."""
    have = set(computed_nonces)
    return [n for n in request_nonces if n not in have]


def max_unscored(num_requested: int) -> int:
    """How many requested nonces may go unscored before a validation gives no verdict (the plugin's rule)."""
    return max(1, int(num_requested * MAX_UNSCORED_FRACTION))


def validation_result(n_total: int, mismatch_nonces: Sequence[int], stat_test: StatTest) -> dict[str, Any]:
    """The validation fields of a response: {n_total, n_mismatch, mismatch_nonces, p_value, fraud_detected}."""
    n_mismatch = len(mismatch_nonces)
    p_value, fraud_detected = fraud_test(
        n_mismatch, n_total, stat_test.p_mismatch, stat_test.fraud_threshold
    )
    return {
        "n_total": n_total,
        "n_mismatch": n_mismatch,
        "mismatch_nonces": list(mismatch_nonces),
        "p_value": p_value,
        "fraud_detected": fraud_detected,
    }


def validate_artifacts(
    computed: Sequence[tuple[int, str]],
    validation_map: Mapping[int, str],
    request_nonces: Sequence[int],
    k_dim: int,
    stat_test: StatTest,
) -> dict[str, Any]:
    """The whole validation: n_total = the requested nonces scored (duplicates each), the unscored ones reported in
    `n_excluded` / `excluded_nonces` (the caller decides whether there were too many for a verdict: max_unscored)."""
    excluded = unscored_nonces(request_nonces, [nonce for nonce, _ in computed])
    mismatch_nonces = find_mismatches(computed, validation_map, k_dim, stat_test.dist_threshold)
    result = validation_result(len(request_nonces) - len(excluded), mismatch_nonces, stat_test)
    result.update(n_excluded=len(excluded), excluded_nonces=excluded)
    return result
