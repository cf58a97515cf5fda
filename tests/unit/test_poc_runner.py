"""backend/engine/poc.py's KV lease with vLLM's real BlockPool and a stand-in for the engine core: the blocks stay
leased from one PoC forward to the next and go back on release (before engine steps) or when a forward fails."""

from __future__ import annotations

from collections import deque
from types import SimpleNamespace

import pytest
from vllm.v1.core.block_pool import BlockPool

from backend.engine.poc import ForwardsLost, NoFreeBlocks, PocRunner
from poc.spec import ArtifactJob, ForwardBatch, PocSpec

BLOCK_SIZE = 16
SEQ_LEN = 64  # 4 blocks a sequence


class FakeCore:
    """The parts of vLLM's EngineCore PocRunner touches; records the block ids each forward got."""

    def __init__(self, num_blocks: int) -> None:
        self.pool = BlockPool(num_gpu_blocks=num_blocks, enable_caching=True, hash_block_size=BLOCK_SIZE)
        self.scheduler = SimpleNamespace(kv_cache_manager=SimpleNamespace(block_pool=self.pool))
        self.vllm_config = SimpleNamespace(cache_config=SimpleNamespace(block_size=BLOCK_SIZE),
                                           model_config=SimpleNamespace(max_model_len=4096))
        self.forwards: list[list[int]] = []
        self.fail = False
        self.launched: deque[list[int]] = deque()  # nonces of each forward poc_launch queued, oldest first
        self.finished = False
        self.is_queued = True  # what the workers answer: the newest forward is wholly queued
        self.layout_problem: str | None = None  # what the workers answer to poc_kv_layout_problem

    def collective_rpc(self, method: str, timeout=None, args=()):
        if method == "poc_hidden_size":
            return [64]
        if method == "poc_layer_range":
            return [(0, 2)]
        if method == "poc_kv_layout_problem":
            return [self.layout_problem]
        if method == "poc_launch":
            batch = args[0]
            self.forwards.append(list(batch.block_ids))
            self.launched.append(list(batch.nonces))
            self.launch_flags = tuple(args[1:])  # (is_chat_running, budget_s, paced, pipelined)
            return [self.is_queued]
        if method == "poc_poll":
            if self.fail:
                raise RuntimeError("worker failed")
            self.poll_flags = tuple(args)  # (wait, budget_s, is_chat_running)
            if not (self.finished or args[0]):
                return [(False, None, self.is_queued)]
            nonces = self.launched.popleft()
            return [(True, [(n, f"v{n}") for n in nonces], self.is_queued)]
        assert method == "poc_artifacts"
        if self.fail:
            raise RuntimeError("worker failed")
        (batch,) = args
        assert isinstance(batch, ForwardBatch) and batch.spec.seq_len == SEQ_LEN
        self.forwards.append(list(batch.block_ids))
        return [[(n, f"v{n}") for n in batch.nonces]]


def job(n: int) -> ArtifactJob:
    return ArtifactJob(PocSpec("B", "k", SEQ_LEN), tuple(range(n)))


def test_blocks_stay_leased_between_forwards_and_return_on_release():
    core = FakeCore(num_blocks=65)  # block 0 is vLLM's null block: 64 usable
    runner = PocRunner(core, max_num_seqs=8, max_batch_tokens=8 * SEQ_LEN)
    free = core.pool.get_num_free_blocks()
    runner.run(job(8), list(range(8)))
    runner.run(job(8), list(range(8, 16)))
    assert core.forwards[0] == core.forwards[1] and len(set(core.forwards[0])) == 32
    assert 0 not in core.forwards[0]
    assert core.pool.get_num_free_blocks() == free - 32
    runner.run(job(2), [16, 17])  # a smaller forward takes a prefix of the held blocks
    assert core.forwards[2] == core.forwards[0][:8]
    runner.release()
    assert core.pool.get_num_free_blocks() == free
    runner.release()  # nothing held: no-op
    assert core.pool.get_num_free_blocks() == free


def test_a_larger_forward_leases_more_and_held_blocks_count_as_available():
    core = FakeCore(num_blocks=33)  # 32 usable: 8 sequences
    runner = PocRunner(core, max_num_seqs=8, max_batch_tokens=8 * SEQ_LEN)
    runner.run(job(2), [0, 1])
    arts, num_run = runner.run(job(8), list(range(8)))  # needs every block, 8 of them held
    assert num_run == 8 and len(arts) == 8 and len(set(core.forwards[1])) == 32
    assert core.pool.get_num_free_blocks() == 0
    runner.release()
    taken = core.pool.get_new_blocks(30)  # chat took the cache: one sequence does not fit
    with pytest.raises(NoFreeBlocks):
        runner.run(job(1), [0])
    core.pool.free_blocks(taken)


def test_a_failed_forward_returns_its_blocks():
    core = FakeCore(num_blocks=65)
    runner = PocRunner(core, max_num_seqs=8, max_batch_tokens=8 * SEQ_LEN)
    free = core.pool.get_num_free_blocks()
    core.fail = True
    with pytest.raises(RuntimeError):
        runner.run(job(4), list(range(4)))
    assert core.pool.get_num_free_blocks() == free


def test_a_launched_forward_keeps_its_blocks_until_polled_back():
    core = FakeCore(num_blocks=65)
    runner = PocRunner(core, max_num_seqs=8, max_batch_tokens=8 * SEQ_LEN)
    free = core.pool.get_num_free_blocks()
    assert runner.launch(job(8), list(range(8)), is_chat_running=True, budget_s=0.001, owner="task") == 8
    assert runner.is_in_flight
    runner.release()  # an engine step beside the forward: its blocks stay leased
    assert core.pool.get_num_free_blocks() == free - 32
    assert runner.poll() is None and runner.is_in_flight
    core.finished = True
    flight, artifacts = runner.poll()
    assert (flight.owner, flight.num_nonces) == ("task", 8) and artifacts == [(n, f"v{n}") for n in range(8)]
    assert not runner.is_in_flight
    runner.release()
    assert core.pool.get_num_free_blocks() == free


def test_a_launch_and_a_poll_tell_the_workers_whether_chat_runs_and_how_it_is_launched():
    """The workers choose the stream (and the SMs) from it, and whether a forward is paced; a poll moves a paced one
    onto PoC's SMs once chat runs."""
    core = FakeCore(num_blocks=65)
    runner = PocRunner(core, max_num_seqs=8, max_batch_tokens=8 * SEQ_LEN)
    runner.launch(job(4), list(range(4)), is_chat_running=False, budget_s=float("inf"), paced=True)
    assert core.launch_flags == (False, float("inf"), True, False)
    assert runner.poll(is_chat_running=True) is None
    assert core.poll_flags == (False, float("inf"), True)
    core.finished = True
    runner.poll()
    assert core.poll_flags == (False, float("inf"), False)
    runner.launch(job(4), list(range(4)), is_chat_running=True, budget_s=0.001)
    assert core.launch_flags == (True, 0.001, False, False)
    core.finished = True
    runner.poll()
    runner.launch(job(4), list(range(4)), is_chat_running=False, budget_s=float("inf"), pipelined=True)
    assert core.launch_flags == (False, float("inf"), False, True) and runner.is_pipelined


def test_a_second_forward_runs_behind_the_first_on_its_blocks_and_they_come_back_in_order():
    core = FakeCore(num_blocks=65)
    runner = PocRunner(core, max_num_seqs=8, max_batch_tokens=8 * SEQ_LEN)
    free = core.pool.get_num_free_blocks()
    runner.launch(job(8), list(range(8)), is_chat_running=True, budget_s=0.001, owner="first")
    assert runner.can_launch
    runner.launch(job(8), list(range(8, 16)), is_chat_running=True, budget_s=0.001, owner="second")
    assert core.forwards[1] == core.forwards[0] and core.pool.get_num_free_blocks() == free - 32
    assert not runner.can_launch  # two in flight
    assert runner.poll() is None
    core.finished = True
    flight, artifacts = runner.poll()
    assert flight.owner == "first" and artifacts == [(n, f"v{n}") for n in range(8)]
    assert runner.is_in_flight and runner.can_launch
    runner.release()  # one still in flight: the blocks stay leased
    assert core.pool.get_num_free_blocks() == free - 32
    flight, artifacts = runner.poll()
    assert flight.owner == "second" and artifacts == [(n, f"v{n}") for n in range(8, 16)]
    assert not runner.is_in_flight
    runner.release()
    assert core.pool.get_num_free_blocks() == free


def test_no_forward_is_launched_behind_one_the_workers_have_not_wholly_queued():
    core = FakeCore(num_blocks=65)
    runner = PocRunner(core, max_num_seqs=8, max_batch_tokens=8 * SEQ_LEN)
    core.is_queued = False  # an eager forward queued a few layers per poll
    runner.launch(job(4), list(range(4)), is_chat_running=True, budget_s=0.001)
    assert not runner.can_launch
    assert runner.poll() is None and not runner.can_launch
    core.is_queued = True
    assert runner.poll() is None and runner.can_launch


def test_a_failed_poll_drops_every_forward_in_flight_and_returns_the_blocks():
    core = FakeCore(num_blocks=65)
    runner = PocRunner(core, max_num_seqs=8, max_batch_tokens=8 * SEQ_LEN)
    free = core.pool.get_num_free_blocks()
    runner.launch(job(4), list(range(4)), is_chat_running=True, budget_s=0.001, owner="first")
    runner.launch(job(4), list(range(4, 8)), is_chat_running=True, budget_s=0.001, owner="second")
    core.fail = True
    with pytest.raises(ForwardsLost, match="worker failed") as lost:
        runner.poll()
    assert [(f.owner, f.num_nonces) for f in lost.value.flights] == [("first", 4), ("second", 4)]
    assert not runner.is_in_flight and runner.can_launch and core.pool.get_num_free_blocks() == free


def test_a_launch_takes_what_the_free_blocks_allow_and_a_failed_poll_returns_them():
    core = FakeCore(num_blocks=17)  # 16 usable: 4 sequences
    runner = PocRunner(core, max_num_seqs=8, max_batch_tokens=8 * SEQ_LEN)
    assert runner.launch(job(8), list(range(8)), is_chat_running=True, budget_s=0.001) == 4
    assert list(core.launched) == [[0, 1, 2, 3]]
    core.fail = True
    with pytest.raises(ForwardsLost):
        runner.poll(wait=True)
    assert not runner.is_in_flight and core.pool.get_num_free_blocks() == 16
