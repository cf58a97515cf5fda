"""Host time of one PoC reflection launch: Triton's own path against poc/cuda_kernels.py's DirectLaunch (GPU).

    python -m bench.triton_launch [--rows 64] [--hidden 1024] [--launches 2000]

The eager PoC forward launches one reflection per decoder layer from the engine thread, so on a host-bound forward
(small batches, TP > 1) each microsecond of it is the forward's. Both paths launch the same compiled kernel; the
rows are few so that the device keeps up and the loop's time is the host's.
"""

from __future__ import annotations

import argparse
import time

import torch

from poc import cuda_kernels


def per_launch_us(launches: int, fn) -> float:
    fn()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(launches):
        fn()
    enqueued = time.perf_counter()
    torch.cuda.synchronize()
    return (enqueued - started) / launches * 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--launches", type=int, default=2000)
    args = p.parse_args(argv)
    x = torch.randn(args.rows, args.hidden, device="cuda").to(torch.bfloat16)
    r = torch.randn(args.rows, args.hidden, device="cuda").to(torch.bfloat16)
    v = torch.randn(args.hidden, device="cuda").to(torch.bfloat16)
    launch = cuda_kernels._reflect_pair_launch()
    figures = {}
    for name in ("triton", "direct", "triton", "direct"):  # alternated: clocks and caches warm for both
        launch.off_reason = "bench: Triton's path" if name == "triton" else None
        figures.setdefault(name, []).append(per_launch_us(args.launches, lambda: cuda_kernels.reflect_pair(x, r, v)))
    plain = per_launch_us(args.launches, lambda: torch.empty_like(x))
    best = {k: min(v) for k, v in figures.items()}
    print(f"reflect_pair [{args.rows}, {args.hidden}] host us per launch: Triton's path {best['triton']:.1f}, "
          f"direct {best['direct']:.1f} ({best['triton'] / best['direct']:.2f}x); torch.empty_like alone {plain:.1f}")


if __name__ == "__main__":
    main()
