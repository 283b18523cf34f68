"""The two ways to stream the LM head + loss backward, measured side by side.

    python -m streamfx.bench.head_strategies [--seq 2048] [--vocab 32000] [--hidden 256]

Both run the head (hidden -> logits -> log-softmax -> masked NLL -> mean) in chunks of tokens
so that one chunk of logits exists at a time, with fp32 accumulation:

  recompute   (streamfx's head_grad="recompute") forward: chunks under no_grad, only the loss sum
              is kept; backward: each chunk's logits are computed again, then differentiated.
  precompute  (streamfx's head_grad="forward", the default where one value carries a gradient)
              forward: each chunk is differentiated right away (grad_output 1); the hidden-state
              gradient [T, d] and the fp32 weight gradient [V, d] are kept until backward,
              which only scales them by the real grad_output.

Reported per strategy: median step time (forward + backward) and the bytes that live from the
forward until the backward (what the strategy adds to the activation memory of the layers).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def _chunk_loss(h, w, labels):
    logits = (h @ w.t()).float()
    return F.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")


def recompute(h, w, labels, n, chunk):
    with torch.no_grad():
        total = sum(_chunk_loss(h[s:s + chunk], w, labels[s:s + chunk]) for s in range(0, len(h), chunk))
    kept = h.numel() * h.element_size()  # the hidden input is saved

    def backward(g):
        dh, dw = torch.empty_like(h), torch.zeros_like(w, dtype=torch.float32)
        for s in range(0, len(h), chunk):
            hc = h[s:s + chunk].detach().requires_grad_(True)
            wl = w.detach().requires_grad_(True)
            gh, gw = torch.autograd.grad(_chunk_loss(hc, wl, labels[s:s + chunk]), (hc, wl), g / n)
            dh[s:s + chunk] = gh
            dw += gw
        return dh, dw

    return total / n, kept, backward


def precompute(h, w, labels, n, chunk):
    dh, dw, total = torch.empty_like(h), torch.zeros_like(w, dtype=torch.float32), 0.0
    for s in range(0, len(h), chunk):
        hc = h[s:s + chunk].detach().requires_grad_(True)
        wl = w.detach().requires_grad_(True)
        loss = _chunk_loss(hc, wl, labels[s:s + chunk])
        gh, gw = torch.autograd.grad(loss, (hc, wl))
        dh[s:s + chunk] = gh
        dw += gw
        total = total + loss.detach()
    kept = dh.numel() * dh.element_size() + dw.numel() * dw.element_size()

    def backward(g):
        return dh * (g / n), dw * (g / n)

    return total / n, kept, backward


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--chunk", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    h = torch.randn(a.seq, a.hidden)
    w = torch.randn(a.vocab, a.hidden) * a.hidden ** -0.5
    labels = torch.randint(0, a.vocab, (a.seq,))
    labels[: a.seq // 4] = -100
    n = int((labels != -100).sum())
    ref_h, ref_w = h.clone().requires_grad_(True), w.clone().requires_grad_(True)
    ref = F.cross_entropy(ref_h @ ref_w.t(), labels, ignore_index=-100)
    ref.backward()
    print(f"T={a.seq} V={a.vocab} d={a.hidden} chunk={a.chunk} fp32, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    print("| strategy | median step s | kept fwd->bwd MiB | loss err | dh err | dW err |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, fn in (("recompute", recompute), ("precompute", precompute)):
        times = []
        for _ in range(a.repeats + 1):
            t0 = time.perf_counter()
            loss, kept, backward = fn(h, w, labels, n, a.chunk)
            dh, dw = backward(torch.tensor(1.0))
            times.append(time.perf_counter() - t0)
        err = lambda x, r: ((x - r).abs().max() / r.abs().max()).item()  # noqa: E731
        print(f"| {name} | {statistics.median(times[1:]):.3f} | {kept / 2**20:.1f} | "
              f"{abs(loss.item() - ref.item()) / abs(ref.item()):.1e} | {err(dh, ref_h.grad):.1e} | "
              f"{err(dw, ref_w.grad):.1e} |")


if __name__ == "__main__":
    main()
