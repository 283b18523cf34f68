"""GRPO with TRL's GRPOTrainer and streambp: one line, ``callbacks=[streamfx.StreamBPCallback()]``.

A tiny random Qwen3 generates 4 completions per prompt (generation runs the uncompiled model, so
decoding lengths never reach the compiled graph), a toy reward scores them, and the clipped
objective with a KL term trains on per-token log-probs that the streamed head computes chunk by
chunk. Two iterations per generation: the old-policy log-probs (no_grad) reuse the training graph.
Run: python examples/grpo_trl.py [--steps 3] [--words 64] [--codegen eager|inductor]
"""
import argparse
import tempfile

import torch
from datasets import Dataset
from trl import GRPOConfig, GRPOTrainer

import streamfx
import tiny


def even_words(completions, **kwargs):
    """Toy reward: how many words of the completion have an even index."""
    return [float(sum(int(w[1:]) % 2 == 0 for w in c.split() if w[1:].isdigit())) for c in completions]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--words", type=int, default=64, help="prompt tokens")
    ap.add_argument("--completion", type=int, default=32, help="completion tokens")
    ap.add_argument("--codegen", default="eager", choices=["inductor", "eager"],
                    help="eager: chunk graphs run as FX graphs (about a minute on CPU); inductor: compiled (minutes)")
    args = ap.parse_args()

    path = tempfile.mkdtemp()  # GRPO builds its reference model from a path: save the tiny model
    tiny.model().save_pretrained(path)
    tiny.tokenizer().save_pretrained(path)
    stream = streamfx.StreamBPCallback(codegen=args.codegen, chunk_size=32, head_chunk_size=32)
    trainer = GRPOTrainer(
        model=path,
        reward_funcs=even_words,
        args=GRPOConfig(**tiny.common_args(args.steps), per_device_train_batch_size=4, num_generations=4,
                        max_completion_length=args.completion, beta=0.04, num_iterations=2,
                        generation_kwargs={"min_new_tokens": args.completion},  # one length: one compile
                        model_init_kwargs={"dtype": torch.float32, "attn_implementation": "sdpa"}),
        train_dataset=Dataset.from_dict({"prompt": tiny.texts(16, args.words)}),
        processing_class=tiny.tokenizer(),
        callbacks=[stream],                      # <- the line
    )
    tiny.train_and_report(trainer, stream)


if __name__ == "__main__":
    main()
