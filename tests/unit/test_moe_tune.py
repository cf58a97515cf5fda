"""bench/moe_tune.py: the candidates divide the quantisation block, the fastest wins per batch, and the file is
the one vLLM reads (batch sizes as keys, the Triton version beside them)."""

import json

from bench import moe_tune


def test_candidates_divide_the_block():
    for size in ("small", "full"):
        space = moe_tune.search_space((128, 128), size)
        assert space and len({json.dumps(c, sort_keys=True) for c in space}) == len(space)
        assert all(128 % c["BLOCK_SIZE_N"] == 0 and 128 % c["BLOCK_SIZE_K"] == 0 for c in space)
    assert len(moe_tune.search_space((128, 128), "small")) < len(moe_tune.search_space((128, 128), "full"))
    # a 64-wide block rules out the 128-wide tiles
    assert all(c["BLOCK_SIZE_N"] == 64 for c in moe_tune.search_space((64, 128), "full"))


def test_fastest_per_batch_and_the_file_vllm_reads():
    a, b = {"BLOCK_SIZE_M": 16}, {"BLOCK_SIZE_M": 64}
    best = moe_tune.best_per_batch({64: [(9.0, a), (7.5, b)], 1: [(3.0, a), (4.0, b)], 8: []})
    assert best == {1: a, 64: b}  # a batch size with no working candidate is left to vLLM's default
    body = json.loads(moe_tune.config_file(best, "3.5.0"))
    assert body.pop("triton_version") == "3.5.0"
    assert {int(k): v for k, v in body.items()} == best


def test_likely_tiles_first_and_the_set_unchanged():
    space = moe_tune.search_space((128, 128), "small")

    def key(c):
        return json.dumps(c, sort_keys=True)

    # PoC's 32 x 1024 tokens on the 235B's 128 experts, top-8: 2,048 tokens an expert, the largest M tile first
    poc = moe_tune.likely_first(space, 32768, 128, 8)
    assert sorted(map(key, poc)) == sorted(map(key, space))
    assert poc[0]["BLOCK_SIZE_M"] == 128 and poc[0]["BLOCK_SIZE_N"] == 128
    assert [c["BLOCK_SIZE_M"] for c in poc[-4:]] == [16] * 4
    # a decode step of 16 tokens: one token an expert, the smallest M tile first
    assert moe_tune.likely_first(space, 16, 128, 8)[0]["BLOCK_SIZE_M"] == 16
    # 512 tokens: 32 an expert
    assert moe_tune.likely_first(space, 512, 128, 8)[0]["BLOCK_SIZE_M"] == 32


def test_fewer_calls_per_graph_at_poc_token_counts():
    assert moe_tune.iters_for(16, 10) == 10
    assert moe_tune.iters_for(2048, 10) == 10
    assert moe_tune.iters_for(4096, 10) == 5
    assert moe_tune.iters_for(32768, 10) == 2
    assert moe_tune.iters_for(65536, 10) == 2


def test_vllms_own_pick_is_a_candidate():
    # the installed vLLM's pick for the 235B's experts on one GPU (no shipped file for N=1536): a PoC forward's
    # 32 x 1024 tokens and a decode step's 4
    poc = moe_tune.vllm_default_config(128, 1536, 4096, 8, (128, 128), 32768)
    decode = moe_tune.vllm_default_config(128, 1536, 4096, 8, (128, 128), 4)
    assert poc is not None and decode is not None
    assert poc["BLOCK_SIZE_M"] > decode["BLOCK_SIZE_M"]
    assert all(128 % c["BLOCK_SIZE_N"] == 0 and 128 % c["BLOCK_SIZE_K"] == 0 for c in (poc, decode))
    # where no tile beats it, the file keeps it rather than the fastest of the tiles tried
    tile = {"BLOCK_SIZE_M": 128}
    assert moe_tune.best_per_batch({32768: [(18470.0, poc), (18648.4, tile)]}) == {32768: poc}
