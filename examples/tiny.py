"""Shared by the trainer examples: a tiny random Qwen3 (no download), a word-level tokenizer, data,
and the report of what streamed."""
import time

import torch

import streamfx

WORDS = [f"w{i}" for i in range(500)]


def tokenizer():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{w: i + 3 for i, w in enumerate(WORDS)}}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>")


def model(layers=2):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen3Config(vocab_size=len(WORDS) + 3, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024,
                      pad_token_id=0, eos_token_id=1, bos_token_id=None)
    cfg._attn_implementation = "sdpa"
    return Qwen3ForCausalLM(cfg)


def texts(n, words, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [" ".join(WORDS[j] for j in torch.randint(0, len(WORDS), (words,), generator=g).tolist()) for _ in range(n)]


def common_args(steps):
    """TrainingArguments fields every example shares (CPU, fp32, no checkpoints or loggers)."""
    return dict(output_dir="/tmp/streamfx-example", max_steps=steps, logging_steps=1, report_to=[], use_cpu=True,
                bf16=False, save_strategy="no", disable_tqdm=True)


def train_and_report(trainer, callback, layers=2):
    t0 = time.perf_counter()
    trainer.train()
    seconds = time.perf_counter() - t0
    state = streamfx.state_of(trainer.model)
    print(f"\ntrained {len(callback.steps)} steps in {seconds:.1f} s; {state.compiles} compile(s)")
    for regions in state.regions:
        print("  streamed regions (name, tokens per chunk):", regions)
    expected = layers + 1  # every layer and the head
    for s in callback.steps:
        print(f"  step {s['step']}: regions forward {s['region_forward']}, backward {s['region_backward']}, "
              f"chunks forward {s['chunks_forward']}, backward {s['chunks_backward']}")
    ok = bool(callback.steps) and all(s["region_backward"] >= expected for s in callback.steps)
    print(f"streamed every step: {'yes' if ok else 'no'} (layers and head, forward and backward)")
    print(f"generation / KV-cache calls run uncompiled: {state.eager_calls}; no_grad log-prob calls streamed: "
          f"{state.no_grad_calls} (old policy, eval), {state.frozen_calls} (reference: adapter off)")
    return ok
