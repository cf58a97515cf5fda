"""End-to-end artifacts from a synthetic last hidden state (golden strings: GOLDEN_B64_H1024) plus encoding and NaN
policy."""

import base64

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis.extra.numpy import arrays

from poc.artifacts import (
    compute_artifact_vectors,
    compute_artifacts,
    decode_vector,
    encode_vectors,
)
from poc.errors import PocInputError
from poc.rng import normal
from poc.seeds import string_seed

BH, PK = "TEST_BLOCK", "test_pub_keys"
CPU = torch.device("cpu")
GOLDEN_B64_H1024 = [
    "CzEBtTYyKLjFMYUwW7YMKD6yNDgxKKwy",
    "x7A2KB42fjFLrLgy5baLNocygbghrB4y",
    "y7NNLFm0XTAptUcxcbYKrba4GK3Lpf62",
    "7y9NtyohdDFKtkqzy7B8Juwys60HMyc5",
]


def _golden_hidden(hidden_size, nonces):
    seeds = [string_seed(f"golden_hidden_{hidden_size}_{n}") for n in nonces]
    return normal(seeds, hidden_size, CPU)


def test_compute_artifacts_golden_h1024():
    out = compute_artifacts(_golden_hidden(1024, range(4)), BH, PK, [0, 1, 2, 3], k_dim=12)
    assert out == list(zip([0, 1, 2, 3], GOLDEN_B64_H1024, strict=False))


def test_compute_artifacts_single_nonce_equals_batched():
    for n in range(4):
        assert compute_artifacts(_golden_hidden(1024, [n]), BH, PK, [n]) == [(n, GOLDEN_B64_H1024[n])]


def test_compute_artifacts_accepts_bf16_hidden():
    hidden = _golden_hidden(1024, range(2)).bfloat16()
    out = compute_artifacts(hidden, BH, PK, [0, 1])
    assert out == compute_artifacts(hidden.float(), BH, PK, [0, 1])


def test_compute_artifacts_vector_shape_and_unit_norm():
    kept, vectors = compute_artifact_vectors(_golden_hidden(256, range(3)), BH, PK, [0, 1, 2], k_dim=5)
    assert kept == [0, 1, 2] and vectors.dtype == torch.float16 and vectors.shape == (3, 5)
    assert torch.allclose(vectors.float().norm(dim=1), torch.ones(3), atol=2e-3)
    assert len(compute_artifacts(_golden_hidden(256, [0]), BH, PK, [0], k_dim=5)[0][1]) == 16


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_compute_artifacts_drops_non_finite_rows(bad):
    hidden = _golden_hidden(1024, range(4))
    hidden[1, 17] = bad
    assert compute_artifacts(hidden, BH, PK, [0, 1, 2, 3]) == [
        (0, GOLDEN_B64_H1024[0]), (2, GOLDEN_B64_H1024[2]), (3, GOLDEN_B64_H1024[3]),
    ]


def test_compute_artifacts_all_nan_gives_empty():
    kept, vectors = compute_artifact_vectors(torch.full((3, 64), float("nan")), BH, PK, [0, 1, 2], k_dim=4)
    assert kept == [] and vectors.shape == (0, 4) and vectors.dtype == torch.float16
    assert compute_artifacts(torch.full((2, 64), float("nan")), BH, PK, [0, 1], k_dim=4) == []


def test_compute_artifacts_zero_row_is_kept_as_zero_vector():
    kept, vectors = compute_artifact_vectors(torch.zeros(1, 64), BH, PK, [0], k_dim=4)
    assert kept == [0] and torch.equal(vectors, torch.zeros(1, 4, dtype=torch.float16))


@pytest.mark.parametrize(
    ("field", "hidden", "nonces", "k_dim"),
    [
        ("k_dim", torch.zeros(1, 8), [0], 0),
        ("k_dim", torch.zeros(1, 8), [0], 9),
        ("nonces", torch.zeros(1, 8), [], 4),
        ("nonces", torch.zeros(2, 8), [0], 4),
        ("last_hidden", torch.zeros(8), [0], 4),
    ],
)
def test_compute_artifacts_rejects_bad_input(field, hidden, nonces, k_dim):
    with pytest.raises(PocInputError) as info:
        compute_artifacts(hidden, BH, PK, nonces, k_dim=k_dim)
    assert info.value.field == field


def _encode(values) -> str:
    """One vector through the batch encoder the artifacts use (a float32 input is rounded to fp16 first)."""
    return encode_vectors(torch.as_tensor(np.asarray(values)).reshape(1, -1))[0]


def test_encode_vectors_little_endian_bytes():
    raw = base64.b64decode(_encode(np.array([1.0], dtype=np.float32)))
    assert raw == b"\x00\x3c"  # fp16 1.0 is 0x3C00, low byte first


def test_encode_vectors_rounds_fp32_to_fp16():
    assert decode_vector(_encode(np.array([0.1], dtype=np.float32)))[0] == np.float32(np.float16(0.1))


def test_encode_vectors_one_string_per_row():
    rows = torch.tensor([[1.0, -2.0], [0.5, 0.25]])
    assert [decode_vector(b).tolist() for b in encode_vectors(rows)] == rows.tolist()


@settings(max_examples=100, deadline=None)
@given(arrays(np.float16, st.integers(0, 32), elements=st.floats(width=16, allow_nan=False)))
def test_encode_decode_round_trip(vec):
    decoded = decode_vector(_encode(vec))
    assert decoded.dtype == np.float32
    assert np.array_equal(decoded, vec.astype(np.float32))


@pytest.mark.parametrize("bad", ["not base64!", "AAA", "AA=="])
def test_decode_vector_rejects_malformed(bad):
    with pytest.raises(PocInputError) as info:
        decode_vector(bad)
    assert info.value.field == "vector_b64"
