"""Memory budgets: parsing them, the report of ``streamfx.plan_memory``, and the run-time policy
that sizes each call's chunks to a budget.

The numbers come from ``stepmodel.StepModel``, built from the step's partitioned graphs when
the backend compiles them (``attach``). A budget is the memory the whole training step may
reach: what is held before the step (parameters, their optimizer state, the inputs) plus the
step's own peak (activations, the regions' working sets, the gradients it allocates).
"""
from __future__ import annotations

import dataclasses
import os
import re

import torch

from . import memory, offload
from .errors import StreamBPError
from .failures import is_device_error
from .passes.schedule import auto_chunk, chunk_candidates, largest_fitting
from .stepmodel import RegionWork, StepModel

UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
FORMS = ("bytes as an int (80_000_000_000)", "a string with a unit ('70GiB', '512MiB', '80GB')",
         "a fraction of the device's memory as a float in (0, 1] (0.9)")


def parse_budget(value, device: str = "cpu") -> int:
    """Bytes of a memory budget given as an int, a string with a unit, or a fraction of the
    device's memory (the GPU's total memory; on a CPU the machine's)."""
    if isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int):
        if value > 0:
            return value
    elif isinstance(value, float):
        if 0 < value <= 1:
            return int(value * device_memory(device))
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", value)
        if m and m.group(2).upper() in UNITS and float(m.group(1)) > 0:
            return int(float(m.group(1)) * UNITS[m.group(2).upper()])
    raise StreamBPError(f"option 'memory_budget' must be {', '.join(FORMS[:-1])} or {FORMS[-1]}; got {value!r}")


def device_memory(device: str) -> int:
    if str(device).startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.device(device)).total_memory
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"


# ---- from an analysis to a step model ---------------------------------------------------------------
def step_models(analysis, device: str = "cpu", codegen: str | None = None, storage: tuple | None = None,
                works: dict | None = None) -> tuple[StepModel, dict]:
    """(the streamed step's model, {baseline name: model}) of an analysis the session kept graphs on.
    ``codegen``: how the regions' chunk graphs will run (default: as the programs say);
    ``storage``: (tier, keep_every) of the calls of ``offload="auto"`` layers (default: none leaves
    the device); ``works``: the regions' working sets of another model of the same analysis (their
    curves are traced once)."""
    fw, bw = analysis.graphs
    seq, fixed = _symbols(analysis)
    if works is not None:
        model = StepModel(fw.graph, bw.graph, works, seq, fixed, device, stores=_stores(analysis, works, storage))
        model.roles = _roles(analysis, fw.graph)
        return model, {}
    works = {}
    for plan, prog in analysis.programs:
        kind = "layer" if plan.kind == "layer" else "head"
        # Inductor's code sizes the head's chunks (its logits and their gradient: measured to 1%);
        # a layer's chunks measure above that model (CPU attention kernels' buffers and more, not
        # yet accounted for: zoo mistral_sliding 0.84) and within 5% of the op-by-op one
        fused = (codegen or prog.codegen) == "inductor" and kind == "head"
        works[prog.key] = RegionWork(prog, kind, memory.common_module(plan.nodes) or plan.name, _window(plan),
                                     fused=fused)
    model = StepModel(fw.graph, bw.graph, works, seq, fixed, device, stores=_stores(analysis, works, storage))
    model.roles = _roles(analysis, fw.graph)
    baselines = {}
    if getattr(analysis, "baseline", None) is not None:
        fw0, bw0 = analysis.baseline
        free = _causal_masks(analysis, fw0.graph, seq, fixed)
        # (the user outputs the streamed step drops, the logits beside the loss, are the ones the
        # caller drops: a trainer keeps the loss alone through the backward)
        dropped = frozenset(getattr(analysis, "dropped", ()))
        baselines["no checkpointing"] = StepModel(fw0.graph, bw0.graph, {}, seq, fixed, device, free=free,
                                                  dropped=dropped)
        ckpt = _checkpointed(analysis, fw0.graph)
        baselines["activation checkpointing"] = StepModel(fw0.graph, bw0.graph, {}, seq, fixed, device, ckpt=ckpt,
                                                          free=free, dropped=dropped)
        for b in baselines.values():
            b.roles = model.roles
    return model, baselines


def _stores(analysis, works: dict, storage: tuple | None) -> dict:
    """{region key: StorePlan} of the analysis' layers that store inputs, "auto" ones resolved at
    ``storage`` (default: none leaves the device)."""
    stored = [id(sp) for sp in getattr(analysis, "stores", ())]
    return {key: sp.resolve(*(storage or (None, 1))) for key, sp in offload.PLANS.items()
            if key in works and id(sp) in stored}


def _window(plan) -> int | None:
    """The most keys before its own rows a chunk of a layer reads, when every attention site of
    the layer has a sliding window or chunked pattern, or is a causal convolution (a chunk [s, e)
    then reads keys from s - W + 1 at the earliest), else None (keys from the first on)."""
    sites = getattr(plan, "sites", ())
    kinds = {s.kind == "conv" for s in sites}
    if len(kinds) > 1:   # (a convolution beside masked attention: keys from the first, ``LayerProgram.key_ranges``)
        return None
    if not sites or any(s.mask_kind not in ("sliding-window", "chunked", "conv") or not s.window for s in sites):
        return None
    return max(s.window for s in sites)


def _checkpointed(analysis, fw) -> dict:
    """Forward node name -> layer, for what activation checkpointing recomputes: the nodes of each
    layer region and every node whose code is in the layer's module (the checkpointed call)."""
    ckpt = {n.name: r.name for r in analysis.regions if r.kind == "layer" for n in r.nodes}
    owners: dict = {}
    for r in analysis.regions:
        if r.kind == "layer":
            owners.setdefault(memory.common_module(r.nodes), []).append(r.name)
    # a module is a layer's when it is that layer region's alone (not the model's, shared by all)
    modules = {m: names[0] for m, names in owners.items() if m and len(names) == 1}
    for n in fw.nodes:
        path = memory.module_path(n) if n.op == "call_function" else ""
        while path and n.name not in ckpt:
            if path in modules:
                ckpt[n.name] = modules[path]
            path = path.rpartition(".")[0]
    return ckpt


def _causal_masks(analysis, fw, seq: set, fixed: dict) -> frozenset:
    """Names of the forward's token-by-token tensors that only make a plain causal mask for an
    SDPA call: a traced graph materialises them, but eagerly transformers passes ``is_causal``
    to SDPA with no mask when no token is padded, so the baselines count them as absent."""
    nodes = {n.name: n for n in fw.nodes}
    free = set()
    for site in getattr(analysis, "sites", ()):
        if site.mask is None or site.mask_kind != "causal" or not site.kind.startswith("sdpa"):
            continue
        todo = [site.mask]
        while todo:
            n = todo.pop()
            if n.name in free or n.name not in nodes or n.op != "call_function":
                continue
            v = n.meta.get("val")
            if not isinstance(v, torch.Tensor):
                continue
            size = memory.nbytes_expr(v)
            small = memory.evaluate(size, {**fixed, **{s: 64 for s in seq}})
            large = memory.evaluate(size, {**fixed, **{s: 128 for s in seq}})
            if large < 4 * small:   # not token by token: the chain's per-token inputs (positions)
                continue
            free.add(n.name)
            todo.extend(n.all_input_nodes)
    return frozenset(free)


def _symbols(analysis) -> tuple[set, dict]:
    """The symbols of the sequence length, and every shape symbol's value at the traced call."""
    for plan in analysis.plans:
        length = plan.length
        if isinstance(length, torch.SymInt):
            env = length.node.shape_env
            fixed = {s: int(v) for s, v in memory.values_of(env).items()}
            seq = set(length.node.expr.free_symbols)
            hint = {fixed[s] for s in seq}
            # Dynamo gives each input's sequence dim its own symbol; those share the length's value
            seq |= {s for s, v in fixed.items() if v in hint}
            return seq, {s: v for s, v in fixed.items() if s not in seq}
    return set(), {}


def _roles(analysis, fw) -> dict:
    """Forward tensor name -> (role, module, source line) for the tensors streamed regions read
    (the region's inputs in the partitioned forward graph, named from the plan's)."""
    roles = {}
    by_key = {prog.key: plan for plan, prog in analysis.programs}
    for n in fw.nodes:
        plan = by_key.get(n.args[0]) if n.op == "call_function" and "streamfx.region" in str(n.target) else None
        if plan is None:
            continue
        module = memory.common_module(plan.nodes) or plan.name
        for x, orig, spec in zip(n.args[1], plan.inputs, plan.in_specs):
            v = x.meta.get("val") if hasattr(x, "meta") else None
            if not spec.sliced or not isinstance(v, torch.Tensor):
                continue
            role = memory.saved_role(plan, spec, v)
            roles.setdefault(memory.base_of(x).name, (role, module, memory.where(orig) or memory.where(x)))
    return roles


class Storages:
    """The storages of layer inputs a step may run with, in the order tried, and the step's model at
    each (built on first use): with ``offload="auto"`` layers, ``offload.storages``; else the one
    the options fixed (``None``)."""

    def __init__(self, base: StepModel, analysis=None, device: str = "cpu", codegen: str | None = None):
        auto = analysis is not None and any(sp.tier == "auto" for sp in getattr(analysis, "stores", ()))
        self.order = offload.storages(device) if auto else [None]
        self.models = {self.order[0]: base}
        self._build = (lambda s: step_models(analysis, device, codegen, storage=s, works=base.works)[0]) if auto else None

    def model(self, storage) -> StepModel:
        if storage not in self.models:
            self.models[storage] = self._build(storage)
        return self.models[storage]


def choose_storage(storages: Storages, T: int, available: int, layer_fixed=None, head_fixed=None,
                   host: int | None = None) -> tuple:
    """(storage, (layer chunk, head chunk)): the first storage at which chunk sizes fit ``available``
    bytes at T (``choose``) and the inputs it puts in pinned host memory fit ``host`` bytes (None:
    any), with the largest chunks there; the last storage's NoFit when none does."""
    for i, storage in enumerate(storages.order):
        model = storages.model(storage)
        try:
            if host is not None and storage and storage[0] == "cpu" and model.host_bytes(T) > host \
                    and i < len(storages.order) - 1:
                continue
            return storage, choose(model, T, available, layer_fixed, head_fixed)
        except NoFit:
            if i == len(storages.order) - 1:
                raise


def host_available() -> int:
    """Bytes of host memory the pinned copies of layer inputs may take: 90% of what the system
    reports available now (``/proc/meminfo``)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 * 9 // 10
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") * 9 // 10


# ---- the report ------------------------------------------------------------------------------------
def training_graph(fn, example_inputs, ran: set):
    """``fn`` (a backend's compiled graph), recording in ``ran`` that it ran where the graph trains
    (an input needs a gradient: a parameter). A traced call whose compiles ran more than one such
    graph is a step in pieces; a graph Dynamo compiled but did not run (it compiled the frame again
    within the call and ran that one: ``explain(..., dynamic=True)`` of a Qwen3) does not count."""
    if not any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs):
        return fn
    key = object()

    def run(*args):
        ran.add(key)
        return fn(*args)

    return run


def one_graph_step(graphs: int, who: str) -> None:
    """Raises unless the step has at most one compiled graph with a backward: the memory model is
    that of one graph's step, and what other graphs keep for their backward (and the activations
    passed between them) would be in no prediction."""
    if graphs > 1:
        raise StreamBPError(
            f"{who}: the step compiles to {graphs} graphs with a backward (Dynamo's graph breaks: "
            f"TORCH_LOGS=graph_breaks lists them), and the memory model predicts the step of one graph: a "
            f"prediction would leave out what the other graphs keep for their backward. Remove the graph "
            f"breaks to plan the model; its streamed regions train as they are")


@dataclasses.dataclass
class MemoryReport:
    """Predicted memory of a training step at any length, from one small-length compile.

    ``step_peak(T)``: bytes by which a step at length T raises the peak above what was held before
    it (parameters, gradients held before it, optimizer state excluded; gradients the step
    allocates included). ``max_length(budget)``: the longest T whose held memory (parameters,
    optimizer state) plus step peak fits. ``method``: "streamfx", "no checkpointing" or
    "activation checkpointing" (Hugging Face's gradient checkpointing)."""
    model: StepModel
    baselines: dict
    param_bytes: int
    optimizer_bytes: int
    traced_length: int
    layer_chunk: int | None = None      # the user's fixed chunk sizes (None: automatic)
    head_chunk: int | None = None
    budget: int | None = None           # the memory_budget option, if given
    default_head: int | None = None     # the head's automatic chunk without a budget
    detached: tuple = ()                # per compiled graph, the user outputs the step drops
    storages: Storages | None = None    # the storages of layer inputs a call may choose (offload="auto")

    @property
    def held(self) -> int:
        return self.param_bytes + self.optimizer_bytes

    def chunks(self, T: int, budget: int | None = None) -> tuple[int, int]:
        """(layer chunk, head chunk) a call at length T runs with: the fixed ones, else the largest
        that fit ``budget`` (default: the memory_budget option), else the automatic rules."""
        return self._choice(T, budget)[1]

    def storage(self, T: int, budget: int | None = None):
        """(tier, keep_every) of the layer inputs of a call at length T with ``offload="auto"``
        (the first that fits ``budget``, default the memory_budget option); None otherwise."""
        return self._choice(T, budget)[0]

    def _choice(self, T: int, budget: int | None) -> tuple:
        budget = budget if budget is not None else self.budget
        storages = self.storages or Storages(self.model)
        if budget is None:
            return storages.order[0], (min(self.layer_chunk or auto_chunk(T), T),
                                       min(self.head_chunk or self.default_head or T, T))
        return choose_storage(storages, T, budget - self.held, self.layer_chunk, self.head_chunk)

    def model_for(self, storage) -> StepModel:
        """The step's model with its layer inputs at ``storage`` (``storages``; None: the one traced)."""
        return self.storages.model(storage) if self.storages is not None else self.model

    def _call(self, T: int, budget: int | None = None) -> tuple:
        """(the step's model of a call at length T, its storage of layer inputs chosen, (layer, head) chunks)."""
        storage, chunks = self._choice(T, budget)
        return self.model_for(storage), storage, chunks

    def step_peak(self, T: int, method: str = "streamfx", budget: int | None = None) -> int:
        if method != "streamfx":
            return self.baselines[method].peak(T)
        model, _, (c, h) = self._call(T, budget)
        return model.peak(T, c, h)

    def max_length(self, budget, method: str = "streamfx", limit: int = 1 << 24) -> int:
        """The longest sequence length whose step fits ``budget`` (0 if none)."""
        return longest_fitting(self, parse_budget(budget), method, limit)

    def breakdown(self, T: int, top: int = 8, choice: tuple | None = None) -> str:
        """The largest terms of the step's peak at T; ``choice``: (storage, (layer chunk, head chunk))
        to break down instead of the call's own (``plan.Extrapolated.choice``)."""
        storage, (c, h) = choice or self._choice(T, None)
        peak, rows = self.model_for(storage).breakdown(T, c, h)
        lines = [f"step at T={T}: chunks of {c} tokens (layers), {h} tokens (head); predicted step peak "
                 f"{gib(peak)} above {gib(self.held)} held (parameters{', optimizer state' if self.optimizer_bytes else ''})"]
        if storage is not None:
            lines.append(f"  {offload.describe_storage(*storage)} (chosen for the memory budget)")
        lines += ["  " + line for line in summarize(rows, top)]
        for name, b in self.baselines.items():
            lines.append(f"  {name}: predicted step peak {gib(b.peak(T))}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.breakdown(self.traced_length)


def summarize(rows: list, top: int = 8) -> list:
    """The largest terms at the peak, tensors of one role summed over the modules that hold one."""
    groups: dict = {}
    for b, role, module, src in rows:
        key = (role, re.sub(r"\.\d+(\.|$)", r".*\1", module))
        g = groups.setdefault(key, [0, [], src])
        g[0] += b
        g[1].append(module)
    out = []
    for (role, pattern), (b, modules, src) in sorted(groups.items(), key=lambda kv: -kv[1][0])[:top]:
        where = modules[0] if len(modules) == 1 else f"{len(modules)}x {pattern}"
        out.append(f"{gib(b):>12}  {role}" + (f" in {where}" if where else "") + (f" ({src})" if src else ""))
    return out


def longest(fits, limit: int = 1 << 24) -> int:
    """The largest T <= limit with fits(T), assuming fits is monotone (doubling, then bisection)."""
    lo, hi = 0, 16
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def choose(model: StepModel, T: int, available: int, layer_fixed=None, head_fixed=None) -> tuple[int, int]:
    """The largest (layer, head) chunk sizes whose step at T stays within ``available`` bytes;
    StreamBPError when none does."""
    profile = model.profile(T)
    out = []
    for kind, fixed in (("layer", layer_fixed), ("head", head_fixed)):
        cands = [min(fixed, T)] if fixed else chunk_candidates(T)
        c = largest_fitting(cands, lambda c: model.fits(T, available, kind, c, profile))
        if c is None:
            raise NoFit(model, T, available)
        out.append(c)
    return tuple(out)


class NoFit(StreamBPError):
    def __init__(self, model, T, available):
        need = model.peak(T, 16, 16)
        super().__init__(f"streamfx: a training step at sequence length {T} needs about {gib(need)} for the step "
                         f"with the smallest chunks, over the {gib(available)} the memory budget leaves it")
        self.need, self.T, self.available = need, T, available


# ---- the run-time policy ----------------------------------------------------------------------------
class BudgetPolicy:
    """Chunk sizes per call from the memory model and a budget (``runtime.RegionProgram.size_for``)."""

    def __init__(self, model: StepModel, config, device: str, held_fn, storages: Storages | None = None):
        self.model, self.config, self.device, self.held_fn = model, config, device, held_fn
        self.storages = storages or Storages(model)
        self.cache = memory.Recent(memory.RECENT)    # T -> (layer, head) chunk sizes
        self.chosen = memory.Recent(memory.RECENT)   # T -> the storage of layer inputs (tier, keep_every) chosen
        self.failed: str | None = None   # why the memory model failed at run time (fixed rules since)

    def budget(self) -> int:
        if self.config.memory_budget is not None:
            return parse_budget(self.config.memory_budget, self.device)
        free, _ = torch.cuda.mem_get_info(torch.device(self.device))
        return free + torch.cuda.memory_allocated(torch.device(self.device))

    def sizes(self, T: int) -> tuple[int, int] | None:
        """(layer, head) chunk sizes at T; None where the memory model failed (the fixed rules then)."""
        if self.failed is not None:
            return None
        if T not in self.cache:
            try:
                budget, held = self.budget(), self.held_fn(T)
                host = host_available() if self.device.startswith("cuda") else None
                self.chosen[T], self.cache[T] = choose_storage(self.storages, T, budget - held, self.config.chunk_size,
                                                               self.config.head_chunk_size, host)
            except NoFit as e:
                fits = lambda t: _fits_any(self.storages, t, budget - held)  # noqa: E731
                raise StreamBPError(
                    f"streamfx: a training step at sequence length {T} is predicted to need {gib(held + e.need)} "
                    f"({gib(held)} held before the step + {gib(e.need)} for the step, at the smallest chunks), over "
                    f"the memory budget of {gib(budget)}; the longest sequence that fits is {longest(fits, T)} tokens"
                    + (" (attention='keep' holds every layer's attention output and log-sum-exp until its backward; "
                       "attention='recompute' holds neither and may move layer inputs off the device)"
                       if self.config.attention == "keep" else "")
                ) from None
            except StreamBPError:
                raise
            except Exception as e:
                if is_device_error(e):
                    raise
                cause = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                if self.config.memory_budget is not None:
                    raise StreamBPError(f"streamfx: memory_budget is set but the step's memory could not be "
                                        f"modelled at sequence length {T} ({cause})") from e
                import warnings

                self.failed = cause
                warnings.warn(f"streamfx: chunk sizes follow the fixed rules: the step's memory could not be "
                              f"modelled at sequence length {T} ({cause})")
                return None
        return self.cache[T]

    def storage(self, T: int) -> tuple:
        """(tier, keep_every) of the layer inputs of ``offload="auto"`` layers at length T (device
        copies where the model failed)."""
        if self.sizes(T) is None or self.chosen.get(T) is None:
            return None, 1
        return self.chosen[T]

    def chunk(self, kind: str, T: int) -> int | None:
        sizes = self.sizes(T)
        if sizes is None:
            return None
        return sizes[0] if kind == "layer" else sizes[1]


def _fits_any(storages: Storages, T, available) -> bool:
    try:
        choose_storage(storages, T, available)
        return True
    except NoFit:
        return False


def attach(analysis, config) -> None:
    """Give every streamed program of the analysis the budget policy (a memory budget, or on a GPU
    without one the free device memory); chunk sizes the user fixed stay as they are."""
    device = _device(analysis)
    if config.memory_budget is None and not device.startswith("cuda"):
        return
    if config.memory_budget is None and config.chunk_size and config.head_chunk_size:
        return
    try:
        model, _ = step_models(analysis, device)
    except Exception as e:  # noqa: BLE001 - a graph the model cannot size keeps the fixed rules
        if config.memory_budget is not None:
            raise StreamBPError(f"streamfx: memory_budget is set but the step's memory could not be modelled "
                                f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from e
        import warnings

        warnings.warn(f"streamfx: chunk sizes follow the fixed rules: the step's memory could not be modelled "
                      f"({type(e).__name__})")
        return
    fw = analysis.graphs[0].graph
    params = [p for p in fw.find_nodes(op="placeholder") if isinstance(p.meta.get("val"), torch.Tensor)]

    def held(T):
        if device.startswith("cuda"):
            return torch.cuda.memory_allocated(torch.device(device))
        subs = model.subs(T)
        return sum(memory.evaluate(memory.nbytes_expr(p.meta["val"]), subs) for p in params)

    policy = BudgetPolicy(model, config, device, held, Storages(model, analysis, device))
    for _, prog in analysis.programs:
        prog.policy = policy
    analysis.step_model = model


def _device(analysis) -> str:
    for plan in analysis.plans:
        for x in plan.inputs:
            v = x.meta.get("val")
            if isinstance(v, torch.Tensor):
                return str(v.device)
    return "cpu"


def longest_fitting(report, budget: int, method: str, limit: int) -> int:
    """The longest T at which ``report.held + report.step_peak(T, method, ...)`` fits ``budget``
    (streamfx's chunks chosen for that budget); 0 if none."""
    def fits(T):
        try:
            return report.held + report.step_peak(T, method, budget if method == "streamfx" else None) <= budget
        except StreamBPError:
            return False

    return longest(fits, limit)
