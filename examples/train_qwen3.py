"""Train a Qwen3-shaped causal LM on long sequences with torch.compile(backend="streambp").

Builds a small Qwen3 model from its config (random weights, no download), checks one step's
loss and gradients against eager autograd, prints what streamfx streamed, then trains a few
SFT steps with a masked prompt, and prints the step's measured memory peak beside the peak
``streamfx.plan_memory`` predicted for it and beside Hugging Face gradient checkpointing's
(measured and predicted). Run: python examples/train_qwen3.py [--seq 2048] [--steps 3]
"""
import argparse
import copy
import time

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

import streamfx


def build(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=4096, hidden_size=128, intermediate_size=384, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                      max_position_embeddings=1 << 16, use_cache=False)
    cfg._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(cfg)


def batch(seq: int, vocab: int, prompt: int):
    ids = torch.randint(0, vocab, (1, seq))
    labels = ids.clone()
    labels[:, :prompt] = -100  # SFT: no loss on the prompt
    return ids, labels


def main() -> None:
    from streamfx.bench.worker import fix_malloc_thresholds

    fix_malloc_thresholds()   # RSS then follows live memory (freed blocks go back to the system)
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--codegen", default="inductor", choices=["inductor", "eager"])
    args = ap.parse_args()

    model = build()
    reference = copy.deepcopy(model)
    ids, labels = batch(args.seq, model.config.vocab_size, prompt=args.seq // 4)
    options = {"chunk_size": args.chunk, "head_chunk_size": args.chunk, "codegen": args.codegen}
    compiled = torch.compile(model, backend="streambp", options=options)

    # one step against eager autograd: the gradients must agree to fp32 precision
    out = compiled(input_ids=ids, labels=labels)
    out.loss.backward()
    ref = reference(input_ids=ids, labels=labels)
    ref.loss.backward()
    err = max(((p.grad - r.grad).abs().max() / r.grad.abs().max()).item()
              for p, r in zip(model.parameters(), reference.parameters()))
    print(f"loss {out.loss.item():.6f} (eager {ref.loss.item():.6f}); logits returned: {out.logits}")
    print(f"max relative gradient error vs eager: {err:.2e}")
    assert err < 1e-4, "gradients differ from eager autograd"

    print(streamfx.explain(build(), input_ids=ids, labels=labels, options=options))   # (the compile's options)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(args.steps):
        opt.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        loss = compiled(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        print(f"step {step}: loss {loss.item():.4f}  {time.perf_counter() - t0:.2f}s")

    # the step's memory: predicted from a short trace, measured over one step
    short = args.seq // 16
    plan = streamfx.plan_memory(build(), input_ids=ids[:, :short], labels=labels[:, :short], options=options)
    streamed, streamed_tensors = measure_step(model, lambda: compiled(input_ids=ids, labels=labels).loss.backward())
    # (Hugging Face's checkpointing: activation_checkpointing_enable in recent transformers)
    (getattr(reference, "activation_checkpointing_enable", None) or reference.gradient_checkpointing_enable)()
    ckpt, ckpt_tensors = measure_step(reference, lambda: reference(input_ids=ids, labels=labels).loss.backward())
    mib = 2 ** 20
    print(f"step peak at T={args.seq}: streamfx measured {streamed / mib:.1f} MiB ({streamed_tensors / mib:.1f} "
          f"of tensors), predicted {plan.step_peak(args.seq) / mib:.1f} MiB; HF gradient checkpointing measured "
          f"{ckpt / mib:.1f} MiB ({ckpt_tensors / mib:.1f} of tensors), predicted "
          f"{plan.step_peak(args.seq, 'activation checkpointing') / mib:.1f} MiB")
    print(plan.breakdown(args.seq))


def measure_step(model, step) -> tuple[int, int]:
    """Bytes by which one step (after a warm-up step) raises the peak: RSS on CPU, and the peak
    of the tensors the step allocates (RSS also holds the allocator's own memory)."""
    from streamfx.bench.worker import MemoryMeter, allocated_peak

    step()
    model.zero_grad(set_to_none=True)
    with MemoryMeter("cpu") as meter:
        step()
    model.zero_grad(set_to_none=True)
    return meter.peak_bytes - meter.pre_bytes, allocated_peak(step)


if __name__ == "__main__":
    main()
