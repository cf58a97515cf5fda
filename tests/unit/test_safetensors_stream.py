"""Unit tests for backend.tools.safetensors_stream: headers the safetensors library reads, shard planning."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from backend.tools.safetensors_stream import (
    INDEX_FILE,
    StoredTensor,
    header_bytes,
    plan_shards,
    shard_file_names,
    write_checkpoint,
)


def _tensors() -> dict[str, StoredTensor]:
    return {"a": StoredTensor("BF16", (3, 5)), "b.scale": StoredTensor("F32", (2,)),
            "c": StoredTensor("F8_E4M3", (7, 3)), "d": StoredTensor("BF16", (1,))}


def test_plan_shards_is_greedy_in_order_and_never_empty() -> None:
    tensors = _tensors()  # 30, 8, 21 and 2 bytes
    assert plan_shards(tensors, 1000) == [["a", "b.scale", "c", "d"]]
    assert plan_shards(tensors, 40) == [["a", "b.scale"], ["c", "d"]]
    assert plan_shards(tensors, 10) == [["a"], ["b.scale"], ["c"], ["d"]]  # an oversized tensor gets its own file
    assert shard_file_names(1) == ["model.safetensors"]
    assert shard_file_names(2) == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_header_is_aligned_and_offsets_are_contiguous() -> None:
    tensors = _tensors()
    raw = header_bytes(list(tensors), tensors)
    length = int.from_bytes(raw[:8], "little")
    assert len(raw) == 8 + length and length % 8 == 0
    header = json.loads(raw[8:])
    assert list(header) == ["__metadata__", *tensors]
    assert [header[n]["data_offsets"] for n in tensors] == [[0, 30], [30, 38], [38, 59], [59, 61]]


@pytest.mark.parametrize("max_shard_bytes", [1000, 40])
def test_write_checkpoint_is_read_back_by_safetensors(tmp_path: Path, max_shard_bytes: int) -> None:
    tensors = {"a": StoredTensor("BF16", (3, 5)), "b": StoredTensor("F32", (2, 2)), "c": StoredTensor("BF16", (4,))}
    arrays = {"a": np.arange(15, dtype=np.uint16).reshape(3, 5), "b": np.eye(2, dtype=np.float32),
              "c": np.array([1, 2, 3, 4], dtype=np.uint16)}
    files = write_checkpoint(tmp_path, tensors, [("a", "b"), ("c",)],
                             lambda group: [arrays[n].tobytes() for n in group], max_shard_bytes)
    loaded = {}
    for name in files:
        if name != INDEX_FILE:
            loaded.update(load_file(tmp_path / name))  # the safetensors library parses our headers
    assert {k: v.contiguous().view(torch.uint8).numpy().tobytes() for k, v in loaded.items()} == {
        k: v.tobytes() for k, v in arrays.items()}
    assert loaded["b"].tolist() == [[1.0, 0.0], [0.0, 1.0]] and loaded["a"].dtype == torch.bfloat16
    if max_shard_bytes == 40:
        index = json.loads((tmp_path / INDEX_FILE).read_text())
        assert index == {"metadata": {"total_size": 30 + 16 + 8},
                         "weight_map": {"a": files[0], "b": files[1], "c": files[1]}}
    else:
        assert files == ["model.safetensors"]
