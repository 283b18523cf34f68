"""DPO with TRL's DPOTrainer, LoRA and streambp: one line, ``callbacks=[streamfx.StreamBPCallback()]``.

A tiny random Qwen3 with LoRA on q/k/v/o (no reference model: the reference is the same model
with the adapter switched off). The policy's chosen/rejected log-probs stream through the layers
and the head; the reference forward has nothing trainable and runs TRL's own vocabulary-tiled
kernel, uncompiled. Checkpointing toggles around it change nothing: one compile for all steps.
Run: python examples/dpo_trl.py [--steps 3] [--words 128] [--codegen eager|inductor]
"""
import argparse

from datasets import Dataset
from peft import LoraConfig
from trl import DPOConfig, DPOTrainer

import streamfx
import tiny


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--words", type=int, default=128, help="tokens per completion (the prompt has as many)")
    ap.add_argument("--codegen", default="eager", choices=["inductor", "eager"],
                    help="eager: chunk graphs run as FX graphs (about a minute on CPU); inductor: compiled (minutes)")
    args = ap.parse_args()

    n = 8
    dataset = Dataset.from_dict({"prompt": tiny.texts(n, args.words, seed=1),
                                 "chosen": [" " + t for t in tiny.texts(n, args.words, seed=2)],
                                 "rejected": [" " + t for t in tiny.texts(n, args.words, seed=3)]})
    stream = streamfx.StreamBPCallback(codegen=args.codegen, chunk_size=64, head_chunk_size=64)
    trainer = DPOTrainer(
        model=tiny.model(),
        args=DPOConfig(**tiny.common_args(args.steps), per_device_train_batch_size=2, max_length=1024),
        train_dataset=dataset,
        processing_class=tiny.tokenizer(),
        peft_config=LoraConfig(r=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]),
        callbacks=[stream],                      # <- the line
    )
    tiny.train_and_report(trainer, stream)


if __name__ == "__main__":
    main()
