"""Where the illegal memory access of the 2026-12-04 run comes from: one streamfx training step of
the Qwen3-8B shape cut to 2 layers, bf16, T=4096 on CUDA, in the variant named by argv[1]:
"default", "novjp" (the chunks' backward by their training compile, not one graph) or "eager"
(codegen="eager": no Inductor in the chunk graphs). Run with CUDA_LAUNCH_BLOCKING=1."""
import sys, time, traceback
import torch
import streamfx
from streamfx.bench import presets

variant = sys.argv[1]
if variant == "novjp":
    from streamfx.runtime import LayerProgram
    LayerProgram.vjp = lambda self, graph: None
import dataclasses
preset = dataclasses.replace(presets.get_preset("qwen3-8b"), num_hidden_layers=2)
model = presets.build_model(preset, "bfloat16", "cuda")
T = 4096
ids = torch.randint(0, model.config.vocab_size, (1, T), device="cuda")
options = {"codegen": "eager"} if variant == "eager" else {}
f = torch.compile(model, backend="streambp", options=options, dynamic=True)
t0 = time.time()
try:
    for i in range(2):
        loss = f(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.cuda.synchronize()
        print(variant, "step", i, "ok", round(time.time() - t0, 1), "s", float(loss), flush=True)
except Exception:
    traceback.print_exc()
    print(variant, "FAILED", flush=True)
from streamfx.runtime import COUNTERS
print(variant, dict(COUNTERS), flush=True)
