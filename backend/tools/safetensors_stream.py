"""Streaming safetensors writer for the model generator: fixed headers, sharding, tensors made by a pool.

The layout is decided here, not by a library, so the bytes are the same everywhere: tensors are written in
the order given, each header is compact JSON in that order padded with spaces to 8 bytes, and a checkpoint
larger than one shard is split greedily in that order into model-0000i-of-0000n.safetensors files with
HF's model.safetensors.index.json beside them. Tensor data is never held whole: a thread pool makes a
window of groups at a time (numpy drops the GIL while filling), and each group is written as it arrives.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DTYPE_BYTES = {"BF16": 2, "F8_E4M3": 1, "F32": 4}
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# HF's shards for large checkpoints are a few GB each; Qwen's releases are about 4 GB.
MAX_SHARD_BYTES = 4_000_000_000


@dataclass(frozen=True)
class StoredTensor:
    dtype: str  # a safetensors dtype name, a key of DTYPE_BYTES
    shape: tuple[int, ...]

    @property
    def num_bytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPE_BYTES[self.dtype]


def plan_shards(tensors: dict[str, StoredTensor], max_shard_bytes: int = MAX_SHARD_BYTES) -> list[list[str]]:
    """Tensor names per file, in order: a new file starts when the next tensor would overflow this one."""
    shards: list[list[str]] = [[]]
    size = 0
    for name, tensor in tensors.items():
        if shards[-1] and size + tensor.num_bytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(name)
        size += tensor.num_bytes
    return shards


def shard_file_names(num_shards: int) -> list[str]:
    if num_shards == 1:
        return [SINGLE_FILE]
    return [f"model-{i:05d}-of-{num_shards:05d}.safetensors" for i in range(1, num_shards + 1)]


def header_bytes(names: Sequence[str], tensors: dict[str, StoredTensor]) -> bytes:
    """The 8-byte length and the JSON header of one file holding `names` in that order."""
    header: dict[str, object] = {"__metadata__": {"format": "pt"}}
    end = 0
    for name in names:
        start, end = end, end + tensors[name].num_bytes
        header[name] = {"dtype": tensors[name].dtype, "shape": list(tensors[name].shape),
                        "data_offsets": [start, end]}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # keep the data section 8-byte aligned
    return struct.pack("<Q", len(text)) + text


def index_json(shards: list[list[str]], tensors: dict[str, StoredTensor]) -> dict:
    files = shard_file_names(len(shards))
    weight_map = {name: file for file, names in zip(files, shards, strict=True) for name in names}
    return {"metadata": {"total_size": sum(t.num_bytes for t in tensors.values())},
            "weight_map": dict(sorted(weight_map.items()))}


def write_checkpoint(out_dir: Path, tensors: dict[str, StoredTensor], groups: Sequence[Sequence[str]],
                     make: Callable[[Sequence[str]], Sequence[bytes | memoryview]],
                     max_shard_bytes: int = MAX_SHARD_BYTES) -> list[str]:
    """Write `tensors` (in their order) into out_dir; returns the file names written.

    `groups` partitions the tensor names, in order; make(group) returns each member's bytes (a weight and its
    scale are made together from the same draws)."""
    assert [n for g in groups for n in g] == list(tensors), "groups must list every tensor, in order"
    shards = plan_shards(tensors, max_shard_bytes)
    files = shard_file_names(len(shards))
    file_of = {name: i for i, names in enumerate(shards) for name in names}
    num_workers = os.cpu_count() or 1
    handles = [open(out_dir / f, "wb") for f in files]  # noqa: SIM115  (closed in finally)
    try:
        for handle, names in zip(handles, shards, strict=True):
            handle.write(header_bytes(names, tensors))
        with ThreadPoolExecutor(num_workers) as pool:
            for start in range(0, len(groups), 4 * num_workers):
                window = groups[start:start + 4 * num_workers]
                for group, blobs in zip(window, pool.map(make, window), strict=True):
                    for name, blob in zip(group, blobs, strict=True):
                        assert memoryview(blob).nbytes == tensors[name].num_bytes, name
                        handles[file_of[name]].write(blob)
    finally:
        for handle in handles:
            handle.close()
    if len(files) > 1:
        text = json.dumps(index_json(shards, tensors), indent=2) + "\n"
        (out_dir / INDEX_FILE).write_text(text, encoding="utf-8")
        files.append(INDEX_FILE)
    return files
