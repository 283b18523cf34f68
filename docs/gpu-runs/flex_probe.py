"""What streamfx does with Hugging Face's flex attention (``attn_implementation="flex_attention"``,
not in the kernel table): a tiny Llama, one training step under ``backend="streambp"`` against
eager. On a GPU: the warnings, whether any layer streamed, the loss and the largest relative
gradient error. On a CPU (torch's flex attention has no backward there) the compile only: torch's
device check is bypassed, the graphs run uncompiled (``codegen="eager"``), the forward runs, and
the warnings are printed.

    python docs/gpu-runs/flex_probe.py [--seq 256]
"""
import argparse
import warnings

import torch
import transformers

import streamfx


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seq", type=int, default=256)
    ns = p.parse_args()
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    if not cuda:
        import torch.nn.attention.flex_attention as fa
        fa._validate_device = lambda *a, **k: None   # (trace only: the backward is not run on a CPU)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4 * ns.seq)
    cfg._attn_implementation = "flex_attention"
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(device).train()
    ref = transformers.AutoModelForCausalLM.from_config(cfg).to(device).train()
    ref.load_state_dict(model.state_dict())
    ids = torch.randint(0, cfg.vocab_size, (2, ns.seq), device=device)
    mask = torch.ones_like(ids)
    mask[1, :5] = 0
    # (on a CPU the graphs run as FX graphs: Inductor has no CPU lowering of flex's backward)
    compiled = torch.compile(model, backend="streambp", options=None if cuda else {"codegen": "eager"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loss = compiled(input_ids=ids, attention_mask=mask, labels=ids).loss
        if cuda:
            loss.backward()
    for w in caught:
        if str(w.message).startswith("streamfx"):
            print("warning:", str(w.message)[:600])
    print(f"device {device}; loss {loss.item():.6f}")
    if cuda:
        ref(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
        err = max(((a.grad - b.grad).abs().max() / b.grad.abs().max().clamp_min(1e-12)).item()
                  for a, b in zip(model.parameters(), ref.parameters()) if b.grad is not None)
        print(f"max relative gradient error vs eager: {err:.2e}")


if __name__ == "__main__":
    main()
