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

Layers of one structure have one plan, so the model is traced with 3 and 4 decoder layers and
every prediction extrapolated linearly to the config's layer count, place by place in the step
(each layer adds its saved input, gradients and parameters; the working set of one layer
stays). ``--offload cpu`` (or ``disk``, or ``auto``: the first that fits) predicts the step with
its layer inputs off the device, ``--host`` the host memory they may take, ``--attention keep`` the
step that keeps every layer's attention output for its backward. With a batch size B the shapes
are traced at that batch size.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import sys
import time

import torch

from . import offload
from .config import StreamConfig
from .errors import StreamBPError
from .membudget import (MemoryReport, Storages, gib, longest_fitting, one_graph_step, parse_budget, step_models,
                        training_graph)
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
TRACED = (3, 4)   # the layer counts the command line traces (``Extrapolated``)
METHODS = ("streamfx", "activation checkpointing", "no checkpointing")


def optimizer_bytes(model, optimizer) -> int:
    """Bytes of optimizer state: a torch optimizer (Adam-like state per parameter it holds, in the
    parameters' dtypes or as it already holds them), or a number of bytes per parameter."""
    params = list(model.parameters())
    if _per_parameter(optimizer):
        return _state_bytes(optimizer, sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params))
    if isinstance(optimizer, torch.optim.Optimizer):
        held = sum(t.numel() * t.element_size() for s in optimizer.state.values() for t in s.values()
                   if isinstance(t, torch.Tensor) and t.dim() > 0)
        if held:
            return held
        per = 2 if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) else 0
        return per * sum(p.numel() * p.element_size() for g in optimizer.param_groups for p in g["params"])
    raise _bad_optimizer(optimizer)


def _bad_optimizer(optimizer) -> StreamBPError:
    return StreamBPError(f"optimizer must be a torch.optim.Optimizer, bytes per parameter (a number) or one of "
                         f"{sorted(OPTIMIZER_BYTES)}; got {optimizer!r}")


def _per_parameter(optimizer) -> bool:
    """Whether ``optimizer`` gives its state per parameter: None, a number of bytes or a name."""
    return optimizer is None or isinstance(optimizer, str) or (isinstance(optimizer, (int, float))
                                                               and not isinstance(optimizer, bool))


def _state_bytes(optimizer, numel: int, nbytes: int) -> int:
    """Optimizer state of ``numel`` parameters of ``nbytes`` for a per-parameter ``optimizer``."""
    if optimizer is None:
        return 0
    if isinstance(optimizer, str):
        if optimizer.lower() not in OPTIMIZER_BYTES:
            raise _bad_optimizer(optimizer)
        return OPTIMIZER_BYTES[optimizer.lower()] * nbytes
    return int(optimizer * numel)


def plan_memory(model, *args, options=None, optimizer=None, **kwargs) -> MemoryReport:
    """The memory report of a training step of ``model`` called as ``model(*args, **kwargs)``
    (see the module docstring). ``options``: the backend's (chunk sizes, memory_budget)."""
    return _plan_memory(model, args, kwargs, options, optimizer)


def _plan_memory(model, args, kwargs, options, optimizer, detach: tuple | None = None,
                 device: str | None = None) -> MemoryReport:
    """``plan_memory``; ``device``: the device the step will run on (default: the inputs'), which
    sizes the model (the allocator's rounding, where a copy of an offloaded input lives);
    ``detach``: per compiled graph (in order), the user outputs the streamed
    step drops (``report.detached`` of a model of the same outputs, such as the same model with
    another layer count), detached before the trace: the backend then traces the graph once
    instead of tracing it again without their gradients. None: the backend's guess
    (``backend.likely_dropped``). A graph with an output detached that the step keeps is traced
    again as it is."""
    from . import frames, runtime
    from .backend import compile_graph
    from .session import Session

    user = StreamConfig.from_options(options)   # (its codegen's graphs are analysed and modelled)
    config = dataclasses.replace(user, codegen="eager", mode="default", inductor_options=None)
    traced = dataclasses.replace(config, memory_budget=None, offload="auto" if config.storage_auto else config.offload)
    codegen = user.codegen
    collected: list = []
    detached: list = []

    trains: set = set()   # the graphs with a backward that ran

    def capture(gm, example_inputs):
        given = None if detach is None else detach[len(detached)] if len(detached) < len(detach) else ()
        session = Session(traced, collected)
        session.keep_graphs = True
        session.passes_of, session.inductor_patches = codegen, user.inductor_patches
        fn = compile_graph(gm, example_inputs, traced, session, detach=given)
        detached.append(tuple(session.detached))
        return training_graph(fn, example_inputs, trains)

    args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, lambda x: x.detach(), (args, kwargs))
    with torch.enable_grad(), runtime.shapes_only():  # (the regions' chunks need not run, nor store)
        frames.traced_call(model, capture, args, kwargs, **_length_symbolic(args, kwargs))
    analyses = [a for a in collected if getattr(a, "graphs", None) is not None]
    if not analyses:
        raise StreamBPError("streamfx.plan_memory: nothing in the model streams (see streamfx.explain)")
    one_graph_step(len(trains), "streamfx.plan_memory")
    a = analyses[-1]
    device = device or _device(args, kwargs)
    step, baselines = step_models(a, device, codegen)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    head = next((p.chunk_size for p, _ in a.programs if p.kind == "head"), None)
    T = _traced_length(a)
    budget = parse_budget(config.memory_budget, device) if config.memory_budget is not None else None
    return MemoryReport(step, baselines, params, optimizer_bytes(model, optimizer), T,
                        config.chunk_size, config.head_chunk_size, budget, head, tuple(detached),
                        Storages(step, a, device, codegen))


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
SEARCHED = 1 << 22   # the longest sequence the extrapolated plan's search tries


class Extrapolated:
    """Reports at ``traced`` = (3, 4) layers, extrapolated linearly to L layers: place by place in
    the step (``StepModel.keyed_peaks``), then the maximum. Extrapolating the peak itself would
    miss a peak that moves with depth: at 2 or 3 layers it can sit at the head's logits, at 36 at
    the end of the backward where every layer's gradients are held; with offloaded inputs, at the
    backward of the second layer (a place between the ends: 3 layers are the fewest that have one).
    Two reports of one model (``traced`` (L, L + 1)) predict that model.

    Reports traced with ``offload="auto"`` give the step at each storage of the layer inputs their
    calls may take (``MemoryReport.storages``): ``tier`` ("cpu", "disk"; "auto": the first of
    device memory, host memory, files that fits; None: device memory) with ``keep_every`` k. With
    k > 1 the layers form groups of k (counted from the first layer; the last group has L mod k
    of them, if any), so the traces are of layer counts congruent to L modulo k, a whole group
    apart (``traced_layers``): each place of the step then extrapolates, the last group's rebuild
    included. ``host``: bytes of pinned host memory the offloaded inputs may take (None: no
    limit)."""

    def __init__(self, r2: MemoryReport, r3: MemoryReport, layers: int, host: int | None = None,
                 tier: str | None = None, traced: tuple = (3, 4), keep_every: int = 1):
        self.r2, self.r3, self.L, self.host, self.traced = r2, r3, layers, host, traced
        self.note: str | None = None   # what the plan assumed of the config (``bounded_by_full_attention``)
        order = r3.storages.order if r3.storages is not None else [None]
        if keep_every == 1:
            self.order = [s for s in order if s is None or (s[1] == 1 and tier in (None, "auto", s[0]))]
        elif r3.storages is None or r3.storages._build is None:
            raise StreamBPError(f"keep_every={keep_every}: trace the step with offload='auto' (its layer "
                                "inputs' storage chosen per call)")
        else:
            tiers = {None: [None], "auto": [None, "cpu", "disk"]}.get(tier, [tier])
            self.order = [(t, keep_every) for t in tiers]
        if not self.order:
            raise StreamBPError(f"offload {tier!r} is not among the storages of the traced step's layer inputs "
                                f"({order}): trace with offload='auto' for a GPU")

    def _lin(self, a: int, b: int) -> int:
        n2, n3 = self.traced
        return a + (b - a) * (self.L - n2) // (n3 - n2)

    def _models(self, method: str = "streamfx", storage=None) -> tuple:
        if method != "streamfx":
            return self.r2.baselines[method], self.r3.baselines[method]
        return self.r2.model_for(storage), self.r3.model_for(storage)

    def _peak(self, m2, m3, T: int, c=None, h=None) -> int:
        k2, k3 = m2.keyed_peaks(T, c, h), m3.keyed_peaks(T, c, h)
        common = k2.keys() & k3.keys()
        if not common:
            return self._lin(m2.peak(T, c, h), m3.peak(T, c, h))
        return max(self._lin(k2[k], k3[k]) for k in common)

    @property
    def held(self) -> int:
        return self._lin(self.r2.held, self.r3.held)

    def host_bytes(self, T: int, storage=None) -> int:
        """Pinned host memory the offloaded layer inputs of a step at length T take."""
        m2, m3 = self._models("streamfx", storage)
        return self._lin(m2.host_bytes(T), m3.host_bytes(T))

    def _chunks(self, m2, m3, T: int, avail: int) -> tuple[int, int]:
        def peak(c, h):
            return self._peak(m2, m3, T, c, h)

        cands = chunk_candidates(T)
        c = largest_fitting(cands, lambda c: peak(c, MIN_CHUNK) <= avail)
        h = largest_fitting(cands, lambda h: peak(c, h) <= avail) if c is not None else None
        if h is None:
            raise StreamBPError(f"no chunk size fits T={T} in {gib(avail + self.held)}")
        return c, h

    def choice(self, T: int, budget: int | None) -> tuple:
        """(storage of the layer inputs, (layer chunk, head chunk)) of a step at T: the first storage
        whose step fits ``budget`` with host memory for its offloaded inputs, the largest chunks
        there; without a budget, the first storage and the automatic chunks."""
        if budget is None:
            return self.order[0], self.r3.chunks(T)
        for i, storage in enumerate(self.order):
            last = i == len(self.order) - 1
            try:
                if self.host is not None and self.host_bytes(T, storage) > self.host:
                    raise StreamBPError(f"the offloaded layer inputs at T={T} need {gib(self.host_bytes(T, storage))} "
                                        f"of host memory; {gib(self.host)} given")
                return storage, self._chunks(*self._models("streamfx", storage), T, budget - self.held)
            except StreamBPError:
                if last:
                    raise

    def chunks(self, T: int, budget: int) -> tuple[int, int]:
        """The largest (layer, head) chunks whose extrapolated step fits ``budget``."""
        return self.choice(T, budget)[1]

    def step_peak(self, T: int, method: str = "streamfx", budget=None) -> int:
        if method == "streamfx":
            return self.peak_at(T, self.choice(T, budget))
        return self._peak(*self._models(method), T)

    def peak_at(self, T: int, choice: tuple) -> int:
        """The streamed step's peak at T with ``choice`` (as ``choice`` gives it) made."""
        storage, (c, h) = choice
        return self._peak(*self._models("streamfx", storage), T, c, h)

    def max_length(self, budget: int, method: str = "streamfx", limit: int = SEARCHED) -> int:
        return longest_fitting(self, budget, method, limit)


# layer types whose attention reads at most the keys a full causal attention reads (a window, a
# chunk of the sequence): a model that mixes them with full attention is planned with every layer
# full, an upper bound
KEY_SUBSETS = ("full_attention", "sliding_attention", "chunked_attention")


def bounded_by_full_attention(config: dict) -> tuple[dict, str | None]:
    """(config, note): a config whose ``layer_types`` mix full attention with attention over fewer
    keys (Gemma 3's sliding layers, Llama 4's chunked ones) as one whose layers are all full
    attention, and the note that says so; any other config as it is, without a note."""
    kinds = config.get("layer_types")
    if not isinstance(kinds, list) or len(set(kinds)) < 2 or not set(kinds) <= set(KEY_SUBSETS):
        return config, None
    counts = ", ".join(f"{kinds.count(k)} {k}" for k in KEY_SUBSETS if k in kinds)
    return dict(config, layer_types=["full_attention"] * len(kinds)), (
        f"the config's layers mix attention types ({counts}); planned with every layer's attention full (a layer "
        f"attending to a window or chunk of the keys reads fewer of them per chunk): its peaks are upper bounds, its "
        f"longest sequences lower bounds")


def _tokens(n: int) -> str:
    return f"at least {n} tokens (the longest searched)" if n >= SEARCHED else f"{n} tokens"


def layers_key(config: dict) -> str:
    """The config's own name for its layer count: ``num_hidden_layers``, or what its config class
    maps that to (GPT-2's ``n_layer``)."""
    import transformers

    kind = config.get("model_type")
    if kind not in transformers.CONFIG_MAPPING:
        raise StreamBPError(f"the config's model_type {kind!r} is not one transformers knows: a Hugging Face "
                            f"config.json names its model_type (e.g. 'qwen3', 'llama')")
    key = transformers.CONFIG_MAPPING[kind].attribute_map.get("num_hidden_layers", "num_hidden_layers")
    if key not in config:
        raise StreamBPError(f"the config gives no layer count ({key!r})")
    return key


def build_meta_model(config: dict, dtype: torch.dtype, layers: int):
    import transformers

    config = dict(config, use_cache=False, **{layers_key(config): layers})
    config.pop("architectures", None)
    kinds = config.get("layer_types")
    if isinstance(kinds, list) and kinds and len(kinds) != layers:
        # (a config saved by transformers 5 names each layer's attention; its length must be the
        # layer count the model is built with)
        if len(set(kinds)) > 1:
            raise StreamBPError(f"the planner traces a few layers and extrapolates, which assumes identical "
                                f"layers; this config's layer_types mixes {sorted(set(kinds))}. Plan a config "
                                f"whose layers share one attention type, or measure the model itself "
                                f"(streamfx.plan_memory on the model)")
        config["layer_types"] = kinds[:1] * layers
    cfg = transformers.AutoConfig.for_model(**config)
    # SDPA where the model has it (as transformers' own default), else its eager attention
    causal_lm = transformers.models.auto.modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING.get(type(cfg), None)
    cfg._attn_implementation = "sdpa" if getattr(causal_lm, "_supports_sdpa", True) else "eager"
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=dtype)
    return model.train()


def report_for(config: dict, dtype, layers: int, batch: int, optimizer, length: int = 32,
               device: str = "cuda", detach: tuple | None = None, options: dict | None = None) -> MemoryReport:
    """The report of the config's model with ``layers`` layers, sized for ``device``. The model is
    built on the meta device, then given uninitialised CPU storage for the short traced call
    (nothing is read from the hub; pages no one writes take no memory). ``detach``: the outputs
    the step drops, from the report of the same config at another layer count (None: guessed,
    ``_plan_memory``); ``options``: the backend's (``offload``).

    The last ``REPORTS_KEPT`` traces are kept by their arguments: plans of one model that differ
    only in what is decided after the trace (the budget, the host memory, the storage of the
    layer inputs among those traced, an optimizer given by name or bytes per parameter) trace it
    once."""
    def traced(optimizer):
        model = build_meta_model(config, dtype, layers).to_empty(device="cpu")
        ids = torch.ones(batch, length, dtype=torch.long)
        report = _plan_memory(model, (), dict(input_ids=ids, labels=ids), options, optimizer, detach, device=device)
        return report, sum(p.numel() for p in model.parameters())

    if not _per_parameter(optimizer):
        return traced(optimizer)[0]
    key = (json.dumps(config, sort_keys=True, default=repr), str(dtype), layers, batch, length, device, detach,
           json.dumps(options, sort_keys=True, default=repr))
    if key in _REPORTS:
        _REPORTS.move_to_end(key)
    else:
        _REPORTS[key] = traced(None)
        while len(_REPORTS) > REPORTS_KEPT:
            _REPORTS.popitem(last=False)
    report, numel = _REPORTS[key]
    return dataclasses.replace(report, optimizer_bytes=_state_bytes(optimizer, numel, report.param_bytes))


REPORTS_KEPT = 8
_REPORTS: collections.OrderedDict = collections.OrderedDict()


def traced_layers(L: int, keep_every: int = 1) -> tuple[int, int]:
    """The layer counts traced to predict L layers: ``TRACED``, or with ``keep_every`` k > 1 the
    fewest of at least ``TRACED[0]`` layers and one whole group that leaves the same last group
    as L (L mod k), and a group more; (L, L + k) where L is no more than the first."""
    k = keep_every
    first = TRACED[0] if k == 1 else next(n for n in range(L % k + k, L + 4 * k, k) if n >= TRACED[0])
    return (first, first + k) if L > first else (L, L + k)


def extrapolated(config: dict, dtype, batch: int = 1, optimizer=None, device: str = "cuda",
                 offload: str | None = None, host: int | None = None, keep_every: int = 1,
                 attention: str = "recompute") -> Extrapolated:
    """The config's model at its layer count, from traces of ``traced_layers`` layers (of its own
    count where that is no more). ``offload``: "cpu", "disk" or "auto" (the first of device
    memory, host memory, files that fits); ``keep_every``: one layer input in k kept, the others
    rebuilt in the backward; either is traced as ``offload="auto"``. ``host``: bytes of host
    memory for the offloaded inputs. ``attention``: the backend's option ("keep": every layer's
    attention output and log-sum-exp held for its backward; not with offload or keep_every)."""
    if not isinstance(keep_every, int) or isinstance(keep_every, bool) or keep_every < 1:
        raise StreamBPError(f"keep_every must be a positive integer; got {keep_every!r}")
    config, note = bounded_by_full_attention(config)
    L = int(config[layers_key(config)])
    traced = traced_layers(L, keep_every)
    options = {"offload": "auto"} if offload or keep_every > 1 else {}
    if attention != "recompute":
        options["attention"] = attention
    StreamConfig.from_options(options)   # (a bad value or combination raises here, before any trace)
    options = options or None
    r2 = report_for(config, dtype, traced[0], batch, optimizer, device=device, options=options)
    r3 = r2 if L <= traced[0] else report_for(config, dtype, traced[1], batch, optimizer, device=device,
                                              detach=r2.detached, options=options)
    model = Extrapolated(r2, r3, L, host, offload, traced, keep_every)
    model.note = note
    return model


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamfx.plan", description=__doc__.split("\n")[0])
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--config", help="a Hugging Face config.json")
    src.add_argument("--preset", choices=sorted(PRESETS))
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--budget", default="80GiB", help="device memory: bytes, '80GiB', '70GB'")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--optimizer", default="none", help=f"{sorted(OPTIMIZER_BYTES)} or bytes per parameter")
    parser.add_argument("--offload", choices=("cpu", "disk", "auto"),
                        help="where streamfx keeps the layer inputs for the backward: pinned host memory, "
                             "files, or the first of device memory, host memory, files that fits (default: "
                             "device memory)")
    parser.add_argument("--host", help="host memory the offloaded layer inputs may take (default: no limit)")
    parser.add_argument("--keep-every", type=int, default=1, metavar="K",
                        help="keep one layer input in K, rebuild the others in the backward (two-level "
                             "recompute; alone or with --offload; traces more layers: K > 1 takes longer)")
    parser.add_argument("--attention", default="recompute", choices=("recompute", "keep"),
                        help="the backend's attention option: 'keep' holds every layer's attention output and "
                             "log-sum-exp for its backward (faster, more memory; not with --offload or --keep-every)")
    parser.add_argument("--length", type=int, help="also print the breakdown at this length (default: streamfx's longest)")
    ns = parser.parse_args(argv)
    if ns.host is not None and ns.offload not in ("cpu", "auto"):
        parser.error("--host: with --offload cpu or auto")
    if ns.keep_every < 1:
        parser.error("--keep-every: a positive integer")
    if ns.attention == "keep" and (ns.offload or ns.keep_every > 1):
        parser.error("--attention keep: not with --offload or --keep-every (the kept attention stays in device memory)")
    config = PRESETS[ns.preset] if ns.preset else json.load(open(ns.config))
    budget = parse_budget(ns.budget)
    opt = ns.optimizer
    try:
        opt = float(opt)
    except ValueError:
        if opt.lower() not in OPTIMIZER_BYTES:
            parser.error(f"--optimizer: one of {sorted(OPTIMIZER_BYTES)} or bytes per parameter")
    t0 = time.perf_counter()
    try:
        model = extrapolated(config, DTYPES[ns.dtype], ns.batch, opt, offload=ns.offload,
                             host=parse_budget(ns.host) if ns.host is not None else None, keep_every=ns.keep_every,
                             attention=ns.attention)
    except StreamBPError as e:   # (what the planner cannot plan, said as such: no traceback)
        parser.exit(2, f"{parser.prog}: error: {e}\n")
    L, r2, r3, traced = model.L, model.r2, model.r3, model.traced
    best = {m: model.max_length(budget, m) for m in METHODS}
    print(f"longest sequence (streamfx): {_tokens(best['streamfx'])}")
    print(f"longest sequence (activation checkpointing): {_tokens(best['activation checkpointing'])}")
    print(f"longest sequence (no checkpointing): {_tokens(best['no checkpointing'])}")
    if not any(best.values()):
        floor = model.step_peak(16, "activation checkpointing")
        print(f"nothing fits in {gib(budget)}: {gib(model.held)} is held before the step, and a step of 16 tokens "
              f"adds {gib(floor)} (checkpointed; its parameters' gradients among it)")
    T = ns.length or best["streamfx"] or 1024
    try:
        choice = model.choice(T, budget)
        peak = gib(model.peak_at(T, choice))
    except StreamBPError as e:
        choice, peak = None, f"more than the budget ({e})"
    if (ns.offload or ns.keep_every > 1) and choice is not None:
        storage = choice[0] or (None, 1)
        host = "" if storage[0] != "cpu" else f"; pinned host memory {gib(model.host_bytes(T, choice[0]))}" \
            + (f" of {gib(model.host)}" if model.host is not None else "")
        print(f"at T={T}: {offload.describe_storage(*storage)}{host}")
    if model.note:
        print(f"note: {model.note}")
    state = "parameters" + (", optimizer state" if opt not in ("none", "sgd", 0.0) else "")
    print(f"budget {gib(budget)}, batch {ns.batch}, {ns.dtype}, {L} layers; held before the step ({state}): "
          f"{gib(model.held)}")
    print(f"at T={T}: predicted step peak {peak} (streamfx), "
          f"{gib(model.step_peak(T, 'activation checkpointing'))} (activation checkpointing)")
    print(f"breakdown at T={T} of the {traced[1] if r3 is not r2 else L}-layer trace (each further layer adds "
          f"its parameters and gradients, and its input where that stays on the device):")
    print(r3.breakdown(T, choice=choice))
    print(f"({time.perf_counter() - t0:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
