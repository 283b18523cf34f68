"""SFT with TRL's SFTTrainer and streambp: one line, ``callbacks=[streamfx.StreamBPCallback()]``.

A tiny random Qwen3 (no download) trains a few steps on CPU with TRL's defaults (gradient
checkpointing on, TRL's fused LM head); streamfx compiles the model in place, switches
checkpointing off (streamed layers keep only their inputs) and streams every layer and the
LM head + loss chunk by chunk. Prints what streamed per step.
Run: python examples/sft_trl.py [--steps 3] [--words 256] [--codegen eager|inductor]
"""
import argparse

from datasets import Dataset
from trl import SFTConfig, SFTTrainer

import streamfx
import tiny


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--words", type=int, default=256, help="tokens per example")
    ap.add_argument("--codegen", default="eager", choices=["inductor", "eager"],
                    help="eager: chunk graphs run as FX graphs (about a minute on CPU); inductor: compiled (minutes)")
    args = ap.parse_args()

    dataset = Dataset.from_dict({"text": tiny.texts(8, args.words)})
    stream = streamfx.StreamBPCallback(codegen=args.codegen, chunk_size=64, head_chunk_size=64)
    trainer = SFTTrainer(
        model=tiny.model(),
        args=SFTConfig(**tiny.common_args(args.steps), per_device_train_batch_size=2, max_length=1024),
        train_dataset=dataset,
        processing_class=tiny.tokenizer(),
        callbacks=[stream],                      # <- the line
    )
    tiny.train_and_report(trainer, stream)


if __name__ == "__main__":
    main()
