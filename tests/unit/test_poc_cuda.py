"""CUDA checks of the PoC math: goldens on the device, bit-equality with the reference's own ops and of the
fused kernels (poc/cuda_kernels.py) with the torch path, memory bound.

Marked `gpu` and skipped without CUDA (CI is CPU-only); needs torch with CUDA but not vLLM. Run on a GPU
machine with `pytest tests/unit -k poc_cuda`.
"""

import math

import numpy as np
import pytest
import torch

from poc.artifacts import compute_artifacts
from poc.rng import householder_vectors, input_embeddings, normal
from poc.seeds import string_seed
from poc.transforms import pick_indices

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

BH, PK = "TEST_BLOCK", "test_pub_keys"
CUDA = "cuda"
MASK32 = 0xFFFFFFFF


def _reference_murmur(keys, seeds):
    # The reference `gpu_random.py` formulation: plain int64 products that wrap past 2^63.
    h = (seeds & MASK32).expand(-1, keys.shape[-1])
    k = keys.to(torch.int64) & MASK32
    k = (k * 0xCC9E2D51) & MASK32
    k = ((k << 15) | (k >> 17)) & MASK32
    k = (k * 0x1B873593) & MASK32
    h = h ^ k
    h = ((h << 13) | (h >> 19)) & MASK32
    h = (h * 5 + 0xE6546B64) & MASK32
    h = h ^ (h >> 16)
    h = (h * 0x85EBCA6B) & MASK32
    h = h ^ (h >> 13)
    h = (h * 0xC2B2AE35) & MASK32
    return h ^ (h >> 16)


def _reference_normal(seeds, n):
    pairs = (n + 1) // 2
    idx = torch.arange(2 * pairs, device=CUDA, dtype=torch.int32).unsqueeze(0).expand(len(seeds), -1)
    u = _reference_murmur(idx, torch.tensor(seeds, device=CUDA).unsqueeze(1)).to(torch.float32) / 4294967296.0
    u1 = torch.clamp(u[:, :pairs], min=1e-10)
    u2 = u[:, pairs:]
    z0 = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    z1 = torch.sqrt(-2.0 * torch.log(u1)) * torch.sin(2.0 * math.pi * u2)
    return torch.cat([z0, z1], dim=1)[:, :n]


@pytest.mark.parametrize("n", [8, 12, 1001, 4096, 262145])
def test_cuda_normal_bit_equal_to_reference_ops(n):
    seeds = [string_seed(f"s{i}") for i in range(16)]
    assert torch.equal(normal(seeds, n, CUDA, max_tile_pairs=50_000), _reference_normal(seeds, n))


def test_cuda_pick_order_equals_cuda_topk():
    seeds = torch.tensor([string_seed(f"{BH}_{PK}_nonce_{n}_pick_12") for n in range(64)], device=CUDA)
    scores = _reference_murmur(torch.arange(1024, device=CUDA, dtype=torch.int32).unsqueeze(0), seeds.unsqueeze(1))
    topk = torch.topk(-scores, 12, largest=True, sorted=False).indices
    assert torch.equal(topk, pick_indices(BH, PK, list(range(64)), 1024, 12, CUDA))


def test_cuda_goldens():
    np.testing.assert_allclose(
        normal([1589641989], 8, CUDA)[0].cpu().numpy(),
        [0.55266076, -0.75137901, -0.83434767, 0.89618230, 1.17974102, 1.37182307, -1.38027108, -0.75416869],
        # Two float32 ulps at |z| < 2: CUDA's logf/cosf may round one ulp away from the CPU's (seen on an
        # H100, torch ops and the fused kernel alike), and the golden is printed to 8 decimals.
        rtol=0, atol=2.4e-7,
    )
    bf16 = input_embeddings(BH, PK, [0], 2, 4, CUDA, torch.bfloat16)[0].float().cpu().tolist()
    assert bf16 == [[0.55078125, -0.75, -0.8359375, 0.89453125], [1.1796875, 1.375, -1.3828125, -0.75390625]]
    hh = householder_vectors(BH, 1, 4096, CUDA)[0, :8].cpu().numpy()
    np.testing.assert_allclose(hh, [0.014585215, -0.003989412, -0.025719061, -0.000206031,
                                    0.001738528, -0.022154555, 0.009364715, -0.010518039], rtol=0, atol=1e-8)
    hidden = torch.cat([normal([string_seed(f"golden_hidden_1024_{n}")], 1024, CUDA) for n in range(4)])
    assert [b64 for _, b64 in compute_artifacts(hidden, BH, PK, [0, 1, 2, 3])] == [
        "CzEBtTYyKLjFMYUwW7YMKD6yNDgxKKwy",
        "x7A2KB42fjFLrLgy5baLNocygbghrB4y",
        "y7NNLFm0XTAptUcxcbYKrba4GK3Lpf62",
        "7y9NtyohdDFKtkqzy7B8Juwys60HMyc5",
    ]


@pytest.mark.parametrize("stronger_rng", [False, True])
def test_cuda_inputs_b64_l1024_h1024_memory_bounded(stronger_rng):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    x = input_embeddings("b", "k", list(range(64)), 1024, 1024, CUDA, torch.bfloat16, stronger_rng=stronger_rng)
    torch.cuda.synchronize()
    output_bytes = x.numel() * x.element_size()
    # Output (128 MiB) plus bounded int64/float32 tile temporaries; an untiled draw would need > 2 GiB.
    assert torch.cuda.max_memory_allocated() - base < output_bytes + 512 * 2**20


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "n", "col0"), [(3, 1, 0), (5, 7, 0), (4, 4096, 3), (2, 262145, 0)])
def test_cuda_fused_normal_bit_equal_to_torch_path(dtype, rows, n, col0):
    from poc.cuda_kernels import available
    from poc.cuda_kernels import normal_into as fused
    from poc.rng import TWO_PI_F32, U1_MIN, normal_into_torch
    seeds = torch.tensor([string_seed(f"f{i}") for i in range(rows)], device=CUDA)
    # A column slice of a wider buffer, like one stronger-RNG segment.
    a = torch.zeros(rows, col0 + n + 2, dtype=dtype, device=CUDA)
    b = a.clone()
    assert available(a)
    fused(a[:, col0:col0 + n], seeds, TWO_PI_F32, U1_MIN)
    normal_into_torch(b[:, col0:col0 + n], seeds)
    assert torch.equal(a, b)


@pytest.mark.parametrize("stronger_rng", [False, True])
def test_cuda_fused_inputs_equal_torch_path(stronger_rng, monkeypatch):
    from poc import cuda_kernels
    fused = input_embeddings(BH, PK, list(range(8)), 256, 1024, CUDA, torch.bfloat16, stronger_rng=stronger_rng)
    monkeypatch.setattr(cuda_kernels, "available", lambda t: False)
    plain = input_embeddings(BH, PK, list(range(8)), 256, 1024, CUDA, torch.bfloat16, stronger_rng=stronger_rng)
    assert torch.equal(fused, plain)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_fused_reflection_matches_torch_path(dtype):
    """Equal except where the dot's fp32 summation order flips its last bit (then one ulp of 2·dot·v).

    Without enable_fp_fusion=False only ~95% of the elements matched (an FMA skipped a rounding)."""
    from poc.cuda_kernels import can_reflect_rows, reflect_pair, reflect_rows
    from poc.transforms import reflect_torch
    g = torch.Generator(device=CUDA).manual_seed(0)
    x = (torch.randn(8192, 1024, device=CUDA, generator=g) * 3).to(dtype)
    r = (torch.randn(8192, 1024, device=CUDA, generator=g) * 3).to(dtype)
    v = householder_vectors(BH, 4, 1024, CUDA)[3]
    assert can_reflect_rows(x, v)
    fused, plain = reflect_rows(x, v).float(), reflect_torch(x, v).float()
    vb = v.to(dtype)
    dot_torch = (x * vb).sum(dim=-1)
    dot_fp32_once = (x * vb).float().sum(dim=-1).to(dtype)  # fp32 accumulation, rounded once
    rows_equal = (fused == plain).all(dim=-1).float().mean().item()
    diff = (fused - plain).abs().max().item()
    same_dot = (dot_torch == dot_fp32_once).float().mean().item()
    print(f"{dtype}: rows bit-equal {rows_equal:.4f}, elements equal {(fused == plain).float().mean().item():.5f}, "
          f"max abs diff {diff:.3g}; torch dot == fp32-once dot {same_dot:.4f}")
    assert diff <= 2 ** -6 * plain.abs().max().item()
    fa, fb = reflect_pair(x, r, v)
    assert torch.equal(fa, reflect_rows(x, v)) and torch.equal(fb, reflect_rows(r, v))
    if dtype == torch.bfloat16:
        assert torch.equal(fused, plain)  # the models' dtype: bit-equal on an H100
    assert rows_equal > 0.95


def test_direct_launches_equal_tritons_own():
    """poc/cuda_kernels.py DirectLaunch: a shape's launches after its first skip Triton's per-call work and give
    the same bits, also for another alignment (a key of its own) and for a pair whose outputs alias (reflect_rows)."""
    from poc import cuda_kernels
    from poc.cuda_kernels import reflect_pair, reflect_rows
    launch = cuda_kernels._reflect_pair_launch()
    g = torch.Generator(device=CUDA).manual_seed(1)
    x = (torch.randn(256, 1024, device=CUDA, generator=g) * 3).to(torch.bfloat16)
    r = (torch.randn(256, 1024, device=CUDA, generator=g) * 3).to(torch.bfloat16)
    v = householder_vectors(BH, 2, 1024, CUDA)[1].to(torch.bfloat16)
    first = reflect_pair(x, r, v)
    keys = len(launch._compiled)
    later = [reflect_pair(x, r, v) for _ in range(3)]
    assert launch.off_reason is None and len(launch._compiled) == max(keys, 1)
    for pair in later:
        assert torch.equal(pair[0], first[0]) and torch.equal(pair[1], first[1])
    single = [reflect_rows(x, v) for _ in range(3)]
    assert all(torch.equal(s, first[0]) for s in single) and launch.off_reason is None
    buf = torch.empty(256 * 1024 + 1, device=CUDA, dtype=torch.bfloat16)
    shifted = buf[1:].view(256, 1024)  # 2 bytes past a 16-byte boundary: Triton compiles another specialisation
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 != 0
    for _ in range(3):
        a, b = reflect_pair(shifted, r, v)
        assert torch.equal(a, first[0]) and torch.equal(b, first[1])
    assert launch.off_reason is None


@pytest.mark.parametrize("hidden", [1024, 4096])
def test_cuda_reflection_fused_into_the_norm_matches_reflect_then_vllms_norm(hidden):
    """reflect_add_rms_norm against its definition and against reflect_pair followed by vLLM's own fused add +
    RMSNorm kernel (where this vLLM build has it): the new residual bit-equal, the output within two bf16 ulps
    where the fp32 sum of squares, reduced in another order, rounds the other way (one in the scaled value, the
    weight's product rounding once more)."""
    from poc.cuda_kernels import can_reflect_into_norm, reflect_add_rms_norm, reflect_pair
    from poc.transforms import reflect_add_rms_norm_torch
    g = torch.Generator(device=CUDA).manual_seed(2)
    h = (torch.randn(1000, hidden, device=CUDA, generator=g) * 3).to(torch.bfloat16)
    r = (torch.randn(1000, hidden, device=CUDA, generator=g) * 3).to(torch.bfloat16)
    v = householder_vectors(BH, 2, hidden, CUDA)[1].to(torch.bfloat16)
    w = (torch.rand(hidden, device=CUDA, generator=g) + 0.5).to(torch.bfloat16)
    assert can_reflect_into_norm(h, r, v, w) and not can_reflect_into_norm(h, r, v, w.float())
    out, residual = reflect_add_rms_norm(h, r, v, w, 1e-6)
    ra, rb = reflect_pair(h, r, v)
    assert torch.equal(residual, ra + rb)
    want_out, want_residual = reflect_add_rms_norm_torch(h, r, v, w, 1e-6)
    assert torch.equal(residual, want_residual)

    def check(want: torch.Tensor, name: str) -> None:
        a, b = out.float(), want.float()
        equal = (a == b).float().mean().item()
        print(f"H={hidden}: output equal to {name} for {equal:.5f} of the elements")
        assert ((a - b).abs() <= b.abs() * 2 ** -6).all() and equal > 0.99

    check(want_out, "the definition")
    try:
        import vllm._C  # noqa: F401  (registers torch.ops._C)
        vllm_norm = torch.ops._C.fused_add_rms_norm
    except (ImportError, AttributeError, RuntimeError) as e:
        print(f"H={hidden}: vLLM's fused_add_rms_norm not importable here ({e}): compared with the definition only")
        return
    vllm_out, vllm_residual = ra.clone(), rb.clone()
    vllm_norm(vllm_out, vllm_residual, w, 1e-6)  # in place: input ← the normed sum, residual ← the sum
    assert torch.equal(residual, vllm_residual)
    check(vllm_out, "vLLM's kernel")


def test_the_start_warm_up_builds_what_a_round_then_launches():
    """After warm_up_poc_kernels a round's shapes build no Triton kernel (fp16 at H = 1344: no other test here
    builds the reflections' 2048-wide tiles; the RNG's build may be another test's, by its classes)."""
    from backend.engine.pocworker.extension import warm_up_poc_kernels
    from backend.engine.warmup import counting_triton_builds
    from poc.cuda_kernels import reflect_add_rms_norm, reflect_pair
    from poc.transforms import reflect

    hidden, dtype, device = 1344, torch.float16, torch.device(CUDA)
    warm = warm_up_poc_kernels(hidden, dtype, device)
    assert warm["triton_builds"] >= 2, warm  # reflect_pair and the norm at least
    builds, restore = counting_triton_builds()
    try:
        for seq_len, batch in ((64, 4), (1024, 2)):
            for stronger in (False, True):
                x = input_embeddings("warm", "pk", list(range(batch)), seq_len, hidden, device, dtype,
                                     stronger_rng=stronger).view(-1, hidden)
            v = torch.nn.functional.normalize(torch.randn(hidden, device=device), dim=0).to(dtype)
            h, r = reflect_pair(x, x * 0.5, v)
            reflect(x, v)
            reflect_add_rms_norm(h, r, v, torch.ones_like(v), 1e-6)
        torch.cuda.synchronize()
    finally:
        restore()
    assert builds() == 0
