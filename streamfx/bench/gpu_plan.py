"""The memory planner's predictions for the GPU bench's memory preset, in a process of its own.

    python -m streamfx.bench.gpu_plan --preset qwen3-8b --dtype bfloat16 --budget BYTES
        --seqs 4096,8192 --device cuda --out plan.json

``streamfx.bench gpu`` starts it (with no GPU visible: the model is traced on the meta device, as
``python -m streamfx.plan`` does) while its GPU parts run, then sets the predictions beside the
measured peaks. Writes, per method (streamfx, ckpt), the predicted step peak at each length (bytes
above the memory held before the step; streamfx with the chunk sizes the budget gives, as its
run-time policy chooses them) and the predicted longest length within ``--budget``.
"""
from __future__ import annotations

import argparse
import json
import time

from . import presets as presets_mod

# bench method -> planner method
PLANNED = {"streamfx": "streamfx", "ckpt": "activation checkpointing"}


def config_of(preset) -> dict:
    """The Hugging Face config of a (dense) bench preset as ``streamfx.plan.report_for`` takes it."""
    return dict(model_type="qwen3", vocab_size=preset.vocab_size, hidden_size=preset.hidden_size,
                intermediate_size=preset.intermediate_size, num_hidden_layers=preset.num_hidden_layers,
                num_attention_heads=preset.num_attention_heads, num_key_value_heads=preset.num_key_value_heads,
                head_dim=preset.head_dim, tie_word_embeddings=preset.tie_word_embeddings,
                max_position_embeddings=preset.max_position_embeddings, rope_theta=preset.rope_theta,
                rms_norm_eps=preset.rms_norm_eps, attention_dropout=0.0)


def predict(preset_name: str, dtype: str, budget: int, seqs, device: str) -> dict:
    from streamfx.errors import StreamBPError
    from streamfx.plan import DTYPES, extrapolated

    t0 = time.perf_counter()
    preset = presets_mod.get_preset(preset_name)
    model = extrapolated(config_of(preset), DTYPES[dtype], 1, "none", device=device)
    out = {"budget": budget, "held": model.held, "steps": [], "longest": {}}
    for seq in seqs:
        for method, planned in PLANNED.items():
            row = {"method": method, "seq": seq}
            try:
                if method == "streamfx":
                    row["chunks"] = list(model.chunks(seq, budget))
                    row["predicted"] = model.step_peak(seq, planned, budget)
                else:
                    row["predicted"] = model.step_peak(seq, planned)
            except StreamBPError as e:
                row["reason"] = str(e)
            out["steps"].append(row)
    for method, planned in PLANNED.items():
        out["longest"][method] = model.max_length(budget, planned)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m streamfx.bench.gpu_plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", required=True)
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--budget", type=int, required=True, help="bytes")
    p.add_argument("--seqs", required=True, help="comma list of lengths")
    p.add_argument("--device", default="cuda", help="the device whose allocator the sizes are rounded for")
    p.add_argument("--out", required=True)
    ns = p.parse_args(argv)
    result = predict(ns.preset, ns.dtype, ns.budget, [int(s) for s in ns.seqs.split(",")], ns.device)
    with open(ns.out, "w") as f:
        json.dump(result, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
