"""backend/engine/pocworker/graphs.py's bookkeeping: which forwards run eager, which are captured, what a replay
rewrites. The capture itself needs CUDA (scripts/gpu_check.sh runs the overlapped tests there, where replays are
compared bit for bit with eager forwards)."""

from __future__ import annotations

import types

import pytest
import torch

from backend.engine.pocworker import graphs
from backend.engine.pocworker.graphs import (
    MAX_GRAPHS,
    WARMUP_FORWARDS,
    Captured,
    GraphUnsupported,
    PocGraphs,
    check_capturable,
)

B, L, H, LAYERS = 2, 4, 3, 5


class Graph:
    def __init__(self) -> None:
        self.replays = 0

    def replay(self) -> None:
        self.replays += 1


def _captured(block_ids: list[int]) -> Captured:
    tables = [(torch.zeros(B, 2, dtype=torch.int32), torch.zeros(B * L, dtype=torch.int64))]
    return Captured(Graph(), torch.zeros(B, L, H), torch.zeros(LAYERS, H), types.SimpleNamespace(tables=tables),
                    list(block_ids), last_hidden=torch.zeros(B, H))


class Graphs(PocGraphs):
    """Captures without CUDA: a graph that counts its replays."""

    def __init__(self, fail: Exception | None = None) -> None:
        super().__init__()
        self.fail, self.captures = fail, 0

    def _capture(self, worker, block_ids, num_seqs, seq_len, fill_inputs, vectors) -> Captured:
        if self.fail is not None:
            raise self.fail
        self.captures += 1
        captured = _captured(block_ids)
        fill_inputs(captured.x)
        captured.vectors.copy_(vectors)
        return captured


def _launch(g: PocGraphs, key=("beside", B, L), block_ids=(1, 2, 3, 4), value: float = 1.0):
    def fill(out: torch.Tensor) -> torch.Tensor:
        return out.fill_(value)
    return g.launch(key, None, list(block_ids), fill, torch.full((LAYERS, H), value))


def test_a_shape_runs_eager_for_its_warm_up_then_from_its_graph():
    g = Graphs()
    assert [_launch(g) for _ in range(WARMUP_FORWARDS)] == [None] * WARMUP_FORWARDS
    first = _launch(g)
    assert first is not None and first.is_queued and first.advance(0.0)
    second = _launch(g)
    assert g.captures == 1 and len(g._captured) == 1
    assert second is not None and second.last_hidden is first.last_hidden  # the graph's own output buffer
    assert g._captured[("beside", B, L)].graph.replays == 2  # the capture replayed once, then each launch


def test_each_stream_kind_and_shape_is_its_own_graph():
    g = Graphs()
    for key in (("beside", B, L), ("alone", B, L), ("beside", B, 2 * L)):
        for _ in range(WARMUP_FORWARDS + 1):
            _launch(g, key)
    assert g.captures == 3


def test_shapes_beyond_max_graphs_stay_eager():
    g = Graphs()
    for n in range(MAX_GRAPHS + 2):
        for _ in range(WARMUP_FORWARDS + 2):
            _launch(g, ("alone", B, n + 1))
    assert len(g._captured) == MAX_GRAPHS
    assert _launch(g, ("alone", B, MAX_GRAPHS + 1)) is None


def test_a_failed_capture_turns_graphs_off_and_forwards_run_eager():
    g = Graphs(fail=GraphUnsupported("attention metadata X is not known to be safe to capture"))
    for _ in range(WARMUP_FORWARDS):
        _launch(g)
    assert _launch(g) is None
    assert g.off_reason == "GraphUnsupported: attention metadata X is not known to be safe to capture"
    assert _launch(g, ("alone", 9, 9)) is None and g.captures == 0


def test_a_replay_rewrites_inputs_vectors_and_only_changed_block_tables(monkeypatch):
    asked = []

    def block_tables(mr, cfg, block_ids, num_seqs, seq_len):
        asked.append(list(block_ids))
        return [(torch.tensor(block_ids, dtype=torch.int32).view(B, 2),
                 torch.arange(B * L, dtype=torch.int64) + block_ids[0])]

    monkeypatch.setattr(graphs, "block_tables", block_tables)
    worker = types.SimpleNamespace(model_runner=None, vllm_config=None)
    g = Graphs()
    for _ in range(WARMUP_FORWARDS + 1):
        _launch(g)
    captured = g._captured[("beside", B, L)]

    def launch(block_ids, value):
        g.launch(("beside", B, L), worker, block_ids, lambda out: out.fill_(value),
                 torch.full((LAYERS, H), value))

    launch([1, 2, 3, 4], 2.0)  # the blocks it was captured on: tables untouched
    assert asked == [] and bool((captured.x == 2.0).all()) and bool((captured.vectors == 2.0).all())
    launch([9, 8, 7, 6], 3.0)
    assert asked == [[9, 8, 7, 6]] and captured.block_ids == [9, 8, 7, 6]
    assert captured.metadata.tables[0][0].tolist() == [[9, 8], [7, 6]] and int(captured.metadata.tables[0][1][0]) == 9
    launch([9, 8, 7, 6], 4.0)
    assert asked == [[9, 8, 7, 6]] and bool((captured.x == 4.0).all())


def _metadata(name: str, *, own_tables: bool = True, schedule=None):
    table, slots = torch.zeros(B, 2, dtype=torch.int32), torch.zeros(B * L, dtype=torch.int64)
    built = type(name, (), {})()
    built.block_table = table if own_tables else table.clone()
    built.slot_mapping, built.scheduler_metadata = slots, schedule
    return types.SimpleNamespace(tables=[(table, slots)], built=[built])


def test_only_known_attention_metadata_on_the_prefills_own_tables_is_captured():
    check_capturable(_metadata("FlashAttentionMetadata"))
    with pytest.raises(GraphUnsupported, match="TritonAttentionMetadata is not known"):
        check_capturable(_metadata("TritonAttentionMetadata"))
    with pytest.raises(GraphUnsupported, match="holds tensors other than"):
        check_capturable(_metadata("FlashAttentionMetadata", own_tables=False))
    with pytest.raises(GraphUnsupported, match="holds tensors other than"):
        check_capturable(_metadata("FlashAttentionMetadata", schedule=torch.zeros(3)))


def test_graphs_are_on_unless_the_environment_says_0(monkeypatch):
    monkeypatch.delenv("POCSERVE_POC_GRAPHS", raising=False)
    assert graphs.enabled()
    monkeypatch.setenv("POCSERVE_POC_GRAPHS", "0")
    assert not graphs.enabled()
