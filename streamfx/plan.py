"""``streamfx.plan_memory`` and ``python -m streamfx.plan``: how long a sequence fits, before any step.

``plan_memory(model, *args, options=None, optimizer=None, **kwargs)`` compiles the model with the
streambp backend at the (small) length of the given inputs, with symbolic sizes, runs its
forward once (its streamed regions only give outputs of the right shapes: nothing of a region
is computed), and returns a ``membudget.MemoryReport`` built from the partitioned graphs:
``report.step_peak(T)``, ``report.max_length(budget)``, the same for the baselines, and a
printable breakdown.

The command line builds a Hugging Face model from its config on the meta device (``--config``
or ``--preset``), gives it uninitialised CPU storage for one short traced call (no weights are
downloaded or initialised, no GPU is needed; CUDA's allocator rounding is applied), and prints
the longest sequence for a budget:

    python -m streamfx.plan --preset qwen3-8b --dtype bf16 --budget 80GiB

Layers of one structure have one plan, so the model is traced with 2 and 3 decoder layers and
every prediction extrapolated linearly to the config's layer count (each layer adds its saved
input, gradients and parameters; the working set of one layer stays). With a batch size B the
shapes are traced at that batch size.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import torch

from .config import StreamConfig
from .errors import StreamBPError
from .membudget import MemoryReport, Storages, gib, longest_fitting, parse_budget, step_models
from .passes.schedule import MIN_CHUNK, chunk_candidates, largest_fitting

# Published shapes (the models' config.json on the Hugging Face hub).
PRESETS = {
    "qwen3-4b": dict(model_type="qwen3", vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     tie_word_embeddings=True, max_position_embeddings=40960, rope_theta=1000000.0,
                     rms_norm_eps=1e-6),
    "qwen3-8b": dict(model_type="qwen3", vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                     num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                     tie_word_embeddings=False, max_position_embeddings=40960, rope_theta=1000000.0,
                     rms_norm_eps=1e-6),
    "llama-3.1-8b": dict(model_type="llama", vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                         num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                         tie_word_embeddings=False, max_position_embeddings=131072, rope_theta=500000.0,
                         rms_norm_eps=1e-5),
}
DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16,
          "fp32": torch.float32, "float32": torch.float32}
OPTIMIZER_BYTES = {"none": 0, "sgd": 0, "adamw": 2, "adam": 2}   # state tensors per parameter
METHODS = ("streamfx", "activation checkpointing", "no checkpointing")


def optimizer_bytes(model, optimizer) -> int:
    """Bytes of optimizer state: a torch optimizer (Adam-like state per parameter it holds, in the
    parameters' dtypes or as it already holds them), or a number of bytes per parameter."""
    params = list(model.parameters())
    if optimizer is None:
        return 0
    if isinstance(optimizer, (int, float)) and not isinstance(optimizer, bool):
        return int(optimizer * sum(p.numel() for p in params))
    if isinstance(optimizer, str):
        return OPTIMIZER_BYTES[optimizer.lower()] * sum(p.numel() * p.element_size() for p in params)
    if isinstance(optimizer, torch.optim.Optimizer):
        held = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                   if isinstance(t, torch.Tensor) and t.dim() > 0)
        if held:
            return held
        per = 2 if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) else 0
        return per * sum(p.numel() * p.element_size() for g in optimizer.param_groups for p in g["params"])
    raise StreamBPError(f"optimizer must be a torch.optim.Optimizer, bytes per parameter (a number) or one of "
                        f"{sorted(OPTIMIZER_BYTES)}; got {optimizer!r}")


def plan_memory(model, *args, options=None, optimizer=None, **kwargs) -> MemoryReport:
    """The memory report of a training step of ``model`` called as ``model(*args, **kwargs)``
    (see the module docstring). ``options``: the backend's (chunk sizes, memory_budget)."""
    return _plan_memory(model, args, kwargs, options, optimizer)


def _plan_memory(model, args, kwargs, options, optimizer, detach: tuple | None = ()) -> MemoryReport:
    """``plan_memory``; ``detach``: per compiled graph (in order), the user outputs the streamed
    step drops (``report.detached`` of a model of the same outputs, such as the same model with
    another layer count), detached before the trace: the backend then traces the graph once
    instead of tracing it again without their gradients. None: every floating-point output of
    one or more dims beside a scalar one (a causal LM's logits beside its loss), the guess that
    holds for a model whose loss is computed in the graph. A graph with an output detached that
    the step keeps is traced again as it is."""
    from . import runtime
    from .backend import compile_graph, detach_outputs
    from .session import Session

    config = dataclasses.replace(StreamConfig.from_options(options), codegen="eager")
    traced = dataclasses.replace(config, memory_budget=None, offload="auto" if config.storage_auto else config.offload)
    collected: list = []
    detached: list = []

    def trace(gm, example_inputs, given=()):
        session = Session(traced, collected)
        session.keep_graphs = True
        session.detached = list(given)
        fn = compile_graph(detach_outputs(gm, given) if given else gm, example_inputs, traced, session)
        return fn, session

    def capture(gm, example_inputs):
        if detach is None:
            given = _outputs_beside_the_loss(gm)
        else:
            given = detach[len(detached)] if len(detached) < len(detach) else ()
        n, original = len(collected), _snapshot(gm) if given else gm
        fn, session = trace(gm, example_inputs, given)
        if set(given) - set(session.dropped_user_outputs):  # (an output it keeps: traced as it is)
            del collected[n:]
            fn, session = trace(original, example_inputs)
        detached.append(tuple(session.detached))
        return fn

    args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda x: x.detach(), (args, kwargs))
    compiled = torch.compile(model, backend=capture, **_length_symbolic(args, kwargs))
    with torch.enable_grad(), runtime.shapes_only():  # (the regions' chunks need not run)
        compiled(*args, **kwargs)
    analyses = [a for a in collected if getattr(a, "graphs", None) is not None]
    if not analyses:
        raise StreamBPError("streamfx.plan_memory: nothing in the model streams (see streamfx.explain)")
    a = analyses[-1]
    device = _device(args, kwargs)
    codegen = StreamConfig.from_options(options).codegen
    step, baselines = step_models(a, device, codegen)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    head = next((p.chunk_size for p, _ in a.programs if p.kind == "head"), None)
    T = _traced_length(a)
    budget = parse_budget(config.memory_budget, device) if config.memory_budget is not None else None
    return MemoryReport(step, baselines, params, optimizer_bytes(model, optimizer), T,
                        config.chunk_size, config.head_chunk_size, budget, head, tuple(detached),
                        Storages(step, a, device, codegen))


def _outputs_beside_the_loss(gm) -> tuple:
    """The indices of a Dynamo graph's floating-point outputs of one or more dims, when another
    output is a scalar (the loss): those a streamed step drops when nothing reads them."""
    out = gm.graph.find_nodes(op="output")[0]
    vals = [x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None for x in out.args[0]]
    floating = [i for i, v in enumerate(vals) if isinstance(v, torch.Tensor) and v.is_floating_point()]
    if not any(vals[i].dim() == 0 for i in floating):
        return ()
    return tuple(i for i in floating if vals[i].dim() > 0)


def _snapshot(gm):
    """The Dynamo graph as it is now, before the backend edits it (sharing its attributes)."""
    copy = torch.fx.GraphModule(gm, gm.graph.__deepcopy__({}), class_name=type(gm).__name__)
    copy.meta = dict(gm.meta)
    return copy


def _length_symbolic(args, kwargs) -> dict:
    """torch.compile's arguments for a trace whose sequence length is a symbol: the last dim of the
    first 2-D integer input (``input_ids``) gives the length, and every dim of that size of every
    input is marked dynamic (the batch and the other sizes stay as they are: a trace with every
    size symbolic takes several times longer). Without such an input, every size is dynamic."""
    leaves = [x for x in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    ids = next((x for x in leaves if x.dim() == 2 and not x.is_floating_point() and x.shape[-1] > 1), None)
    if ids is None:
        return {"dynamic": True}
    T = ids.shape[-1]
    for x in leaves:
        for d, n in enumerate(x.shape):
            if n == T:
                torch._dynamo.maybe_mark_dynamic(x, d)
    return {}


def _traced_length(a) -> int:
    for p in a.plans:
        n = p.length
        return int(n.node.hint) if isinstance(n, torch.SymInt) else int(n)
    return 0


def _device(args, kwargs) -> str:
    for x in torch.utils._pytree.tree_leaves((args, kwargs)):
        if isinstance(x, torch.Tensor):
            return str(x.device)
    return "cpu"


# ---- the command line -------------------------------------------------------------------------------
class Extrapolated:
    """Reports at 2 and 3 layers, extrapolated linearly to L layers: place by place in the step
    (``StepModel.keyed_peaks``), then the maximum. Extrapolating the peak itself would miss a peak
    that moves with depth: at 2 or 3 layers it can sit at the head's logits, at 36 at the end of
    the backward where every layer's gradients are held."""

    def __init__(self, r2: MemoryReport, r3: MemoryReport, layers: int):
        self.r2, self.r3, self.L = r2, r3, layers

    def _lin(self, a: int, b: int) -> int:
        return a + (b - a) * (self.L - 2)

    def _peak(self, m2, m3, T: int, c=None, h=None) -> int:
        k2, k3 = m2.keyed_peaks(T, c, h), m3.keyed_peaks(T, c, h)
        common = k2.keys() & k3.keys()
        if not common:
            return self._lin(m2.peak(T, c, h), m3.peak(T, c, h))
        return max(self._lin(k2[k], k3[k]) for k in common)

    @property
    def held(self) -> int:
        return self._lin(self.r2.held, self.r3.held)

    def chunks(self, T: int, budget: int) -> tuple[int, int]:
        """The largest (layer, head) chunks whose extrapolated step fits ``budget``."""
        avail = budget - self.held

        def peak(c, h):
            return self._peak(self.r2.model, self.r3.model, T, c, h)

        cands = chunk_candidates(T)
        c = largest_fitting(cands, lambda c: peak(c, MIN_CHUNK) <= avail)
        h = largest_fitting(cands, lambda h: peak(c, h) <= avail) if c is not None else None
        if h is None:
            raise StreamBPError(f"no chunk size fits T={T} in {gib(budget)}")
        return c, h

    def step_peak(self, T: int, method: str = "streamfx", budget=None) -> int:
        if method == "streamfx":
            c, h = self.chunks(T, budget) if budget is not None else self.r3.chunks(T)
            return self._peak(self.r2.model, self.r3.model, T, c, h)
        return self._peak(self.r2.baselines[method], self.r3.baselines[method], T)

    def max_length(self, budget: int, method: str = "streamfx", limit: int = 1 << 22) -> int:
        return longest_fitting(self, budget, method, limit)


def build_meta_model(config: dict, dtype: torch.dtype, layers: int):
    import transformers

    config = dict(config, num_hidden_layers=layers, use_cache=False)
    config.pop("architectures", None)
    cfg = transformers.AutoConfig.for_model(**config)
    cfg._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.train()


def report_for(config: dict, dtype, layers: int, batch: int, optimizer, length: int = 32,
               device: str = "cuda", detach: tuple | None = None) -> MemoryReport:
    """The report of the config's model with ``layers`` layers, sized for ``device``. The model is
    built on the meta device, then given uninitialised CPU storage for the short traced call
    (nothing is read from the hub; pages no one writes take no memory). ``detach``: the outputs
    the step drops, from the report of the same config at another layer count (None: guessed,
    ``_plan_memory``)."""
    model = build_meta_model(config, dtype, layers).to_empty(device="cpu")
    ids = torch.ones(batch, length, dtype=torch.long)
    report = _plan_memory(model, (), dict(input_ids=ids, labels=ids), None, optimizer, detach)
    for m in [report.model, *report.baselines.values()]:
        m.device = device
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamfx.plan", description=__doc__.split("\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="a Hugging Face config.json")
    src.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--budget", default="80GiB", help="device memory: bytes, '80GiB', '70GB'")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--optimizer", default="none", help=f"{sorted(OPTIMIZER_BYTES)} or bytes per parameter")
    parser.add_argument("--length", type=int, help="also print the breakdown at this length (default: streamfx's longest)")
    ns = parser.parse_args(argv)
    config = PRESETS[ns.preset] if ns.preset else json.load(open(ns.config))
    budget = parse_budget(ns.budget)
    opt = ns.optimizer
    try:
        opt = float(opt)
    except ValueError:
        if opt.lower() not in OPTIMIZER_BYTES:
            parser.error(f"--optimizer: one of {sorted(OPTIMIZER_BYTES)} or bytes per parameter")
    t0 = time.perf_counter()
    r2 = report_for(config, DTYPES[ns.dtype], 2, ns.batch, opt)
    r3 = report_for(config, DTYPES[ns.dtype], 3, ns.batch, opt, detach=r2.detached)
    L = int(config["num_hidden_layers"])
    model = Extrapolated(r2, r3, L)
    best = {m: model.max_length(budget, m) for m in METHODS}
    print(f"longest sequence (streamfx): {best['streamfx']} tokens")
    print(f"longest sequence (activation checkpointing): {best['activation checkpointing']} tokens")
    print(f"longest sequence (no checkpointing): {best['no checkpointing']} tokens")
    T = ns.length or best["streamfx"] or 1024
    state = "parameters" + (", optimizer state" if opt not in ("none", "sgd", 0.0) else "")
    print(f"budget {gib(budget)}, batch {ns.batch}, {ns.dtype}, {L} layers; held before the step ({state}): "
          f"{gib(model.held)}")
    print(f"at T={T}: predicted step peak {gib(model.step_peak(T, 'streamfx', budget))} (streamfx), "
          f"{gib(model.step_peak(T, 'activation checkpointing'))} (activation checkpointing)")
    print(f"breakdown at T={T} of the 3-layer trace (each further layer adds its layer input, parameters "
          f"and gradients):")
    print(r3.breakdown(T))
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
