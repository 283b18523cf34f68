"""Where the illegal memory access of the 2026-12-04 H200 run comes from. One streamfx training
step (two, when the first runs) of the Qwen3-8B shape cut to a few layers, bf16, under
CUDA_LAUNCH_BLOCKING=1, in the variant named by argv[1]:
  default       every graph compiled by Inductor
  chunks-eager  the chunk graphs run as FX graphs (no joint vjp), the outer graphs by Inductor
  outer-eager   the outer graphs run as FX graphs, the chunk graphs by Inductor
Every Inductor graph call is recorded (input shapes, strides, storage offsets, alignment); where a
call raises, the last calls and the failing graph's generated code are written under $OUT."""
import collections, dataclasses, os, sys, time, traceback
import torch
import streamfx
from streamfx.bench import presets
from torch._inductor.output_code import CompiledFxGraph

variant, T, layers = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
preset_name = sys.argv[4] if len(sys.argv) > 4 else "qwen3-8b"
device = "cuda" if torch.cuda.is_available() else "cpu"
out = os.environ.get("OUT", "/tmp/probe-out")
os.makedirs(out, exist_ok=True)
RING = collections.deque(maxlen=40)
SEEN = {}


def meta(x):
    if isinstance(x, torch.Tensor):
        return (f"T{tuple(x.shape)} st{tuple(x.stride())} off{x.storage_offset()} {str(x.dtype)[6:]} "
                f"al{x.data_ptr() % 16} nbytes{x.untyped_storage().nbytes()} contig{int(x.is_contiguous())}")
    return repr(x)


_call = CompiledFxGraph.__call__


def traced_call(self, inputs):
    gid = SEEN.setdefault(id(self), len(SEEN))
    RING.append((gid, [meta(x) for x in inputs]))
    try:
        return _call(self, inputs)
    except Exception:
        with open(f"{out}/{variant}-failing-graph.py", "w") as f:
            f.write(self.source_code)
        with open(f"{out}/{variant}-calls.txt", "w") as f:
            for g, ms in RING:
                f.write(f"graph {g}\n" + "".join(f"   {m}\n" for m in ms))
        raise


CompiledFxGraph.__call__ = traced_call

if variant == "chunks-eager":
    from streamfx.chunks import ChunkGraph
    _fn = ChunkGraph.fn
    ChunkGraph.fn = lambda self, codegen, train, grads=(): _fn(self, "eager", train, grads)
    ChunkGraph.vjp = lambda self, codegen, grads: None
elif variant == "outer-eager":
    import importlib
    backend = importlib.import_module("streamfx.backend")
    _compile = backend._compile
    backend._compile = lambda gm, ex, config, session: _compile(gm, ex, dataclasses.replace(config, codegen="eager"), session)

preset = dataclasses.replace(presets.get_preset(preset_name), num_hidden_layers=layers)
model = presets.build_model(preset, "bfloat16", device)
torch.manual_seed(0)
ids = torch.randint(0, model.config.vocab_size, (1, T), device=device)
f = torch.compile(model, backend="streambp", dynamic=True)
t0 = time.time()
try:
    for i in range(2):
        loss = f(input_ids=ids, labels=ids).loss
        loss.backward()
        if device == "cuda":
            torch.cuda.synchronize()
        g = model.model.layers[0].self_attn.q_proj.weight.grad
        print(variant, "step", i, "ok", round(time.time() - t0, 1), "s", float(loss.detach()),
              "grad norm", float(g.float().norm()), flush=True)
except Exception:
    traceback.print_exc()
    print(variant, "FAILED", round(time.time() - t0, 1), "s", flush=True)
from streamfx.runtime import COUNTERS
print(variant, {k: v for k, v in COUNTERS.items() if v}, "inductor graphs", len(SEEN), flush=True)
