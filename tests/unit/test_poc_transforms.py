"""Reflections, the GPU-order k-dim pick and the Haar rotation (artifact steps 3–7, poc/transforms.py)."""

import hypothesis.strategies as st
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis.extra.numpy import arrays

from poc.errors import PocInputError
from poc.rng import normal
from poc.seeds import pick_seeds
from poc.transforms import (
    haar_rotate,
    haar_rotate_seeded,
    normalize_rows,
    pick_indices,
    pick_scores,
    reflect,
    topk_cuda_order,
)

BH, PK = "TEST_BLOCK", "test_pub_keys"
CPU = torch.device("cpu")

GOLDEN_PICKS_H1024 = [
    [58, 90, 286, 289, 307, 427, 496, 530, 531, 579, 609, 209],
    [1, 23, 200, 384, 434, 510, 585, 669, 707, 792, 859, 568],
    [15, 112, 332, 368, 444, 539, 567, 591, 634, 675, 920, 1017],
    [2, 16, 93, 374, 421, 462, 476, 604, 633, 704, 1013, 482],
]

finite_floats = st.floats(-100, 100, allow_nan=False, width=32)


def _unit(v):
    return v / v.norm()


def test_pick_indices_golden_gpu_order_h1024():
    assert pick_indices(BH, PK, [0, 1, 2, 3], 1024, 12, CPU).tolist() == GOLDEN_PICKS_H1024


def test_pick_indices_single_row_equals_batched():
    for n in range(4):
        assert pick_indices(BH, PK, [n], 1024, 12, CPU).tolist() == [GOLDEN_PICKS_H1024[n]]


def test_pick_indices_differs_from_cpu_topk():
    scores = pick_scores(pick_seeds(BH, PK, [0, 1, 2, 3], 12), 1024, CPU)
    cpu_order = torch.topk(-scores, k=12, largest=True, sorted=False).indices
    ours = pick_indices(BH, PK, [0, 1, 2, 3], 1024, 12, CPU)
    assert cpu_order.tolist() != ours.tolist()
    # Same set, different order: only the order is a device artefact.
    assert torch.equal(cpu_order.sort(dim=1).values, ours.sort(dim=1).values)


def test_topk_cuda_order_threshold_element_last():
    scores = torch.tensor([[50, 10, 40, 30, 20, 60]])
    # 3 smallest: 10 (idx1), 20 (idx4), 30 (idx3) -> below-threshold in index order, then the threshold.
    assert topk_cuda_order(scores, 3).tolist() == [[1, 4, 3]]


def test_topk_cuda_order_ties_at_threshold_in_index_order():
    scores = torch.tensor([[5, 1, 5, 5, 0]])
    # k=3: kth value 5; below: idx 1, 4; then equal ones by index, cut at k.
    assert topk_cuda_order(scores, 3).tolist() == [[1, 4, 0]]
    assert topk_cuda_order(scores, 5).tolist() == [[1, 4, 0, 2, 3]]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=64, unique=True), st.data())
def test_topk_cuda_order_chooses_k_smallest(values, data):
    k = data.draw(st.integers(1, len(values)))
    out = topk_cuda_order(torch.tensor([values]), k)[0].tolist()
    assert sorted(values[i] for i in out) == sorted(values)[:k]
    assert out[:-1] == sorted(out[:-1])
    assert values[out[-1]] == max(values[i] for i in out)


@pytest.mark.parametrize("k", [0, 1025, -1])
def test_pick_indices_rejects_bad_k(k):
    with pytest.raises(PocInputError) as info:
        pick_indices(BH, PK, [0], 1024, k, CPU)
    assert info.value.field == "k_dim"


@settings(max_examples=50, deadline=None)
@given(arrays(np.float32, 12, elements=finite_floats), arrays(np.float32, 12, elements=finite_floats))
def test_reflect_is_involution(x, v):
    v = torch.from_numpy(v).double()
    if v.norm() < 1e-3:
        return
    v = _unit(v)
    x = torch.from_numpy(x).double()
    assert torch.allclose(reflect(reflect(x, v), v), x, atol=1e-9)


@settings(max_examples=50, deadline=None)
@given(arrays(np.float32, 16, elements=finite_floats), arrays(np.float32, 16, elements=finite_floats))
def test_reflect_preserves_norm(x, v):
    v = torch.from_numpy(v).double()
    if v.norm() < 1e-3:
        return
    x = torch.from_numpy(x).double()
    assert torch.isclose(reflect(x, _unit(v)).norm(), x.norm(), rtol=1e-9, atol=1e-9)


def test_reflect_casts_v_to_x_dtype():
    x = torch.randn(3, 8, dtype=torch.bfloat16)
    v = _unit(torch.randn(8))
    out = reflect(x, v)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, x - 2 * (x * v.bfloat16()).sum(-1, keepdim=True) * v.bfloat16())


def test_reflect_batched_per_row_vectors():
    x = torch.randn(4, 6)
    v = normalize_rows(torch.randn(4, 6), eps=0.0)
    out = reflect(x, v)
    for i in range(4):
        assert torch.allclose(out[i], reflect(x[i], v[i]))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=5), st.integers(1, 16))
def test_haar_rotation_preserves_norm(nonces, k):
    x = normal([abs(n) % 2**32 for n in nonces], k, CPU) * 3.0
    y = haar_rotate(x, BH, PK, nonces)
    assert y.shape == x.shape and y.dtype == torch.float32
    assert torch.allclose(y.norm(dim=1), x.norm(dim=1), rtol=1e-5)


def test_haar_rotation_is_orthonormal():
    k = 12
    basis = torch.eye(k, dtype=torch.float32)
    # The same nonce on every row: the rows of the output are the images of the basis, i.e. Q^T.
    q = haar_rotate(basis, BH, PK, [7] * k)
    assert torch.allclose(q @ q.T, torch.eye(k), atol=1e-4)


def test_haar_rotation_matches_explicit_reflections():
    k = 4
    x = normal([1, 2], k, CPU)
    seeds = [[11, 12], [21, 22], [31, 32]]
    y = haar_rotate_seeded(x, seeds)
    for b in range(2):
        row = x[b].clone()
        for step in seeds:
            v = normal([step[b]], k, CPU)[0]
            v = v / (v.norm() + 1e-30)
            row = row - 2 * (row * v).sum() * v
        assert torch.equal(y[b], row)


def test_haar_rotate_rejects_row_count_mismatch():
    with pytest.raises(PocInputError) as info:
        haar_rotate(torch.zeros(2, 4), BH, PK, [0])
    assert info.value.field == "nonces"


def test_normalize_rows_adds_eps_to_norm():
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    out = normalize_rows(x)
    assert torch.equal(out[0], x[0] / (torch.tensor(5.0) + 1e-8))
    assert torch.equal(out[1], torch.zeros(2))
