"""Two CUDA green contexts over disjoint SMs, made through the driver API (bench.partition).

torch's `GreenContext.create` takes the first SMs of a fresh split each time, so two of its contexts overlap; this
splits the device once and makes a context of each part. It can also give each context work queues of its own
(CUDA 13.1's balanced scope), which torch 2.11 cannot ask for.
"""

from __future__ import annotations

import ctypes

import torch


class _SmResource(ctypes.Structure):
    _fields_ = [("sm_count", ctypes.c_uint), ("min_partition", ctypes.c_uint), ("alignment", ctypes.c_uint),
                ("flags", ctypes.c_uint)]


class _WorkqueueConfig(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int), ("concurrency_limit", ctypes.c_uint), ("sharing_scope", ctypes.c_int)]


class _Resource(ctypes.Structure):
    """CUdevResource as CUDA 13 lays it out (144 bytes: type, 92 bytes of padding, a 40-byte union, a pointer);
    12.4-12.9's is 144 bytes too (a 48-byte union)."""

    class _Union(ctypes.Union):
        _fields_ = [("sm", _SmResource), ("wq", _WorkqueueConfig), ("raw", ctypes.c_uint8 * 40)]

    _fields_ = [("type", ctypes.c_int), ("pad", ctypes.c_uint8 * 92), ("u", _Union), ("next", ctypes.c_void_p)]


def green_split(sms: int, priorities: tuple[int, int], balanced_wq: bool):
    """`sms` SMs (rounded up by the driver) and the rest, each a green context with a stream of the given priority
    and (balanced_wq) work queues of its own. Returns (stream on `sms`, stream on the rest, (n, rest), handles to
    keep while the streams are used)."""
    cuda = ctypes.CDLL("libcuda.so.1")

    def check(name: str, code: int) -> None:
        if code != 0:
            raise RuntimeError(f"{name} failed: CUresult {code}")

    dev = ctypes.c_int()
    check("cuDeviceGet", cuda.cuDeviceGet(ctypes.byref(dev), 0))
    whole, part, rest = _Resource(), _Resource(), _Resource()
    check("cuDeviceGetDevResource(SM)", cuda.cuDeviceGetDevResource(dev, ctypes.byref(whole), 1))
    groups = ctypes.c_uint(1)
    check("cuDevSmResourceSplitByCount", cuda.cuDevSmResourceSplitByCount(
        ctypes.byref(part), ctypes.byref(groups), ctypes.byref(whole), ctypes.byref(rest), 0, sms))
    wq = _Resource()
    if balanced_wq:
        check("cuDeviceGetDevResource(WORKQUEUE_CONFIG)", cuda.cuDeviceGetDevResource(dev, ctypes.byref(wq), 1000))
        wq.u.wq.sharing_scope = 1  # CU_WORKQUEUE_SCOPE_GREEN_CTX_BALANCED
    streams, handles = [], []
    for res, priority in zip((part, rest), priorities, strict=True):
        pair = (_Resource * 2)()
        ctypes.memmove(ctypes.addressof(pair[0]), ctypes.addressof(res), ctypes.sizeof(_Resource))
        ctypes.memmove(ctypes.addressof(pair[1]), ctypes.addressof(wq), ctypes.sizeof(_Resource))
        pair[0].next = pair[1].next = None
        desc, ctx, stream = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
        check("cuDevResourceGenerateDesc", cuda.cuDevResourceGenerateDesc(ctypes.byref(desc), pair,
                                                                         2 if balanced_wq else 1))
        check("cuGreenCtxCreate", cuda.cuGreenCtxCreate(ctypes.byref(ctx), desc, dev, 1))
        check("cuGreenCtxStreamCreate", cuda.cuGreenCtxStreamCreate(ctypes.byref(stream), ctx, 1, priority))
        streams.append(torch.cuda.ExternalStream(stream.value))
        handles.append((ctx, stream, pair))
    return streams[0], streams[1], (part.u.sm.sm_count, rest.u.sm.sm_count), handles
