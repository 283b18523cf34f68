"""Shape guards on the GPU: streamfx training steps of the Qwen3-8B shape cut to 2 layers, bf16,
under Inductor, at the lengths given (argv[1], comma list), each checked against eager autograd:
the gradients' relative error (streamfx bf16 and eager bf16, each against an fp32 eager
reference), the step's time, the compiles it ran (chunk graphs, joint vjps, guard recompiles),
and the shape guards each chunk-graph compile took."""
import copy, dataclasses, sys, time, traceback
import torch
import streamfx
from streamfx import chunks
from streamfx.bench import presets
from streamfx.runtime import COUNTERS

lengths = [int(t) for t in sys.argv[1].split(",")]
device = "cuda" if torch.cuda.is_available() else "cpu"
preset = dataclasses.replace(presets.get_preset(sys.argv[2] if len(sys.argv) > 2 else "qwen3-8b"), num_hidden_layers=2)
model = presets.build_model(preset, "bfloat16", device)
eager = copy.deepcopy(model)
ref = copy.deepcopy(model).float()
f = torch.compile(model, backend="streambp", dynamic=True)
names = ["model.layers.0.self_attn.q_norm.weight", "model.layers.1.input_layernorm.weight",
         "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.down_proj.weight", "lm_head.weight",
         "model.embed_tokens.weight", "model.norm.weight"]


def grads(m):
    out = {n: p.grad.float().clone() for n, p in m.named_parameters() if n in names}
    m.zero_grad(set_to_none=True)
    return out


def err(a, b):
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


for T in lengths:
    torch.manual_seed(T)
    ids = torch.randint(0, model.config.vocab_size, (1, T), device=device)
    before = dict(COUNTERS)
    t0 = time.time()
    try:
        loss = f(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.cuda.synchronize() if device == "cuda" else None
    except Exception:
        traceback.print_exc()
        print("T", T, "FAILED", flush=True)
        break
    dt = time.time() - t0
    got = grads(model)
    ref(input_ids=ids, labels=ids).loss.backward()
    want = grads(ref)
    lb = eager(input_ids=ids, labels=ids).loss
    lb.backward()
    base = grads(eager)
    ran = {k: COUNTERS[k] - before[k] for k in ("chunk_compiles", "vjp_compiles", "guard_recompiles", "region_fallbacks",
                                                 "chunks_forward", "chunks_backward")}
    print(f"T {T} ok {dt:.1f} s loss {float(loss):.5f} eager {float(lb):.5f} {ran}", flush=True)
    for n in names:
        print(f"   {n}: streamfx {err(got[n], want[n]):.2e} eager-bf16 {err(base[n], want[n]):.2e}", flush=True)
for name, kind, variants in chunks.compiled_variants():
    print("GUARDS", name, kind, variants, flush=True)
