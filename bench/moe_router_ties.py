"""Near-tie MoE routing: how often a nonce's artifact jumps between the CPU engine and the HF reference.

    python -m bench.moe_router_ties --nonces 400 --seq-len 64 --scales 1:1 10:5

Each --scales G:E is the generated tiny-moe (8 experts, top-2) with every router gate multiplied by G and every
expert weight by E. At 1:1 (the generator's init, std 0.02) the MoE output is ~1% of the residual stream and
routing hardly matters; at 10:5 it is about as large as the residual and the router logits spread over several
units, as in a trained model (the script prints the ratio of the MoE output's norm to the residual's).

For each, the served engine (backend + frontend, PoC through the HTTP API) and tests/reference_poc.py's
HF-transformers forward compute the same nonces. With --against tp2 (or pp2) the served engine at TP=PP=1 is
compared with itself at TP=2 (PP=2) instead: does tensor parallelism's reduction order flip near-tied routes?

The script prints the fraction of nonces with L2 > 0.02 (and > 0.4, the network's loosest threshold), and the
smallest top-k router margin at the last position (logit k minus logit k+1, minimum over layers, from the HF
forward) of the jumping nonces and of the others: a jump with a tiny margin is a near-tie that the two
implementations' rounding resolved differently.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

from bench.procs import Proc, free_port, raise_on_signals, stop_all, wait_http_ok
from poc.artifacts import vector_l2
from tests.stack import backend_args, frontend_args

BLOCK_HASH, PUBLIC_KEY = "TIES_BLOCK", "ties_key"
THRESHOLDS = (0.02, 0.05, 0.1, 0.2, 0.4)  # 0.02: the tests' bound; 0.2-0.4: the chain's dist_threshold
NEAR_TIE = 0.05  # router logits closer than this at the last position: within reach of bf16 rounding
TOPOLOGY_FLAGS = {"tp2": ("--tensor-parallel-size", "2"), "pp2": ("--pipeline-parallel-size", "2")}


def scaled_model(src: Path, dst: Path, gate_scale: float, expert_scale: float) -> Path:
    """A copy of src with the routers and the experts scaled (bf16, rounded once)."""
    from safetensors.torch import load_file, save_file
    dst.mkdir(parents=True, exist_ok=True)
    for p in src.iterdir():
        if p.suffix == ".json" and p.name != "pocserve_model.json":
            shutil.copy(p, dst / p.name)
    tensors = load_file(src / "model.safetensors")
    for name, t in tensors.items():
        scale = gate_scale if name.endswith("mlp.gate.weight") else expert_scale if ".mlp.experts." in name else 1
        if scale != 1:
            tensors[name] = (t.float() * scale).to(t.dtype)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def served_artifacts(model_dir: Path, work: Path, nonces: list[int], seq_len: int, batch: int,
                     extra: tuple[str, ...] = ()) -> dict[int, str]:
    address, port = f"ipc://{work}/backend.ipc", free_port()
    procs = [Proc("backend", backend_args(model_dir, address, "--state-dir", str(work / "state"), *extra),
                  work / "backend.log").start()]
    try:
        procs.append(Proc("frontend", frontend_args(address, port), work / "frontend.log").start())
        url = f"http://127.0.0.1:{port}"
        wait_http_ok(f"{url}/health", procs, 600)
        out: dict[int, str] = {}
        for start in range(0, len(nonces), 4 * batch):
            body = {"block_hash": BLOCK_HASH, "block_height": 1, "public_key": PUBLIC_KEY, "node_id": 0,
                    "node_count": 1, "nonces": nonces[start:start + 4 * batch], "batch_size": batch, "wait": True,
                    "params": {"model": "tiny", "seq_len": seq_len}}
            r = httpx.post(f"{url}/api/v1/pow/generate", json=body, timeout=600)
            r.raise_for_status()
            out.update({a["nonce"]: a["vector_b64"] for a in r.json()["artifacts"]})
        return out
    finally:
        stop_all(procs)


def reference(model_dir: Path, nonces: list[int], seq_len: int, batch: int) -> tuple[dict[int, str], dict]:
    """HF artifacts, each nonce's smallest last-position top-k router margin, and the MoE/residual norm ratio."""
    import torch

    from tests.reference_poc import HFReference
    ref = HFReference(model_dir)
    top_k = ref.model.config.num_experts_per_tok
    margins: list[torch.Tensor] = []  # one [B] per layer of the current batch
    ratios: list[float] = []
    residual_norms: list[torch.Tensor] = []

    def gate_hook(_module, _inputs, output):
        logits = output[0].float().reshape(len(current), seq_len, -1)[:, -1]
        top = logits.topk(top_k + 1, dim=-1).values
        margins.append(top[:, top_k - 1] - top[:, top_k])

    def residual_hook(_module, inputs):
        residual_norms.append(inputs[0][:, -1].float().norm(dim=-1))  # the stream the MoE output is added to

    def mlp_hook(_module, _inputs, output):
        ratios.append((output[:, -1].float().norm(dim=-1) / residual_norms.pop()).mean().item())

    layers = ref.model.model.layers
    handles = [h for layer in layers for h in (layer.mlp.gate.register_forward_hook(gate_hook),
                                               layer.post_attention_layernorm.register_forward_pre_hook(residual_hook),
                                               layer.mlp.register_forward_hook(mlp_hook))]
    arts: dict[int, str] = {}
    min_margin: dict[int, float] = {}
    try:
        for start in range(0, len(nonces), batch):
            current = nonces[start:start + batch]
            margins.clear()
            arts.update(ref.artifacts(BLOCK_HASH, PUBLIC_KEY, current, seq_len))
            per_nonce = torch.stack(margins).min(dim=0).values
            min_margin.update({n: float(m) for n, m in zip(current, per_nonce, strict=True)})
    finally:
        for h in handles:
            h.remove()
    return arts, {"min_margin": min_margin, "moe_out_over_residual": float(np.mean(ratios))}


def measure(src: Path, work: Path, gate_scale: float, expert_scale: float, args) -> dict:
    model_dir = scaled_model(src, work / "model", gate_scale, expert_scale)
    nonces = list(range(args.first_nonce, args.first_nonce + args.nonces))
    started = time.monotonic()
    served = served_artifacts(model_dir, work, nonces, args.seq_len, args.batch)
    served_s = time.monotonic() - started
    ref, diag = reference(model_dir, nonces, args.seq_len, args.batch)
    if args.against != "hf":  # the served engine at another topology; the margins still come from the HF forward
        ref = served_artifacts(model_dir, work / args.against, nonces, args.seq_len, args.batch,
                               TOPOLOGY_FLAGS[args.against])
    l2 = np.array([vector_l2(served[n], ref[n]) for n in nonces])
    margin = np.array([diag["min_margin"][n] for n in nonces])
    near_tie = margin < NEAR_TIE
    row = {"against": args.against, "gate_scale": gate_scale, "expert_scale": expert_scale, "num_nonces": len(nonces),
           "seq_len": args.seq_len, "served_s": round(served_s, 1),
           "moe_out_over_residual": round(diag["moe_out_over_residual"], 3),
           "l2_quantiles": {q: round(float(np.quantile(l2, q)), 5) for q in (0.5, 0.9, 0.99, 1.0)},
           "num_l2_over": {t: int((l2 > t).sum()) for t in THRESHOLDS},
           "frac_l2_over": {t: round(float((l2 > t).mean()), 4) for t in THRESHOLDS},
           # Are the jumps near-ties? Margins of the nonces past each threshold, against everyone's.
           "median_margin_l2_over": {t: round(float(np.median(margin[l2 > t])), 4) if (l2 > t).any() else None
                                     for t in THRESHOLDS},
           "median_margin_all": round(float(np.median(margin)), 4),
           "frac_near_tie": round(float(near_tie.mean()), 4),
           "frac_near_tie_with_l2_over_0.1": round(float((l2[near_tie] > 0.1).mean()), 4) if near_tie.any() else None,
           "frac_others_with_l2_over_0.1": round(float((l2[~near_tie] > 0.1).mean()), 4)}
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nonces", type=int, default=400)
    p.add_argument("--first-nonce", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--scales", nargs="+", default=["1:1", "10:5"], help="GATE:EXPERT weight multipliers")
    p.add_argument("--against", default="hf", choices=["hf", *TOPOLOGY_FLAGS],
                   help="compare the served engine (TP=PP=1) with the HF reference or with itself at TP=2 / PP=2")
    p.add_argument("--json", default="")
    args = p.parse_args(argv)
    raise_on_signals()
    from backend.tools.modelgen import ensure_model
    rows = []
    with tempfile.TemporaryDirectory(prefix="moe-ties-") as tmp:
        src = ensure_model(Path(tmp) / "tiny-moe", "tiny-moe")
        for spec in args.scales:
            gate_scale, expert_scale = (float(x) for x in spec.split(":"))
            row = measure(src, Path(tmp) / spec.replace(":", "_"), gate_scale, expert_scale, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
    for r in rows:
        over = "  ".join(f">{t}: {r['num_l2_over'][t]} ({100 * r['frac_l2_over'][t]:.2f}%)" for t in THRESHOLDS)
        print(f"vs {r['against']}: gate x{r['gate_scale']:g} experts x{r['expert_scale']:g} (MoE out/residual "
              f"{r['moe_out_over_residual']}), {r['num_nonces']} nonces, L={r['seq_len']}: L2 {over}; "
              f"p50/p90/p99/max {list(r['l2_quantiles'].values())}; near-tie (margin < {NEAR_TIE}) nonces "
              f"{100 * r['frac_near_tie']:.1f}%, of which L2 > 0.1: {r['frac_near_tie_with_l2_over_0.1']}, "
              f"others: {r['frac_others_with_l2_over_0.1']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
