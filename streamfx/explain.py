"""``streamfx.explain(model, *args, **kwargs)``: what the backend sees and decides, in words."""
from __future__ import annotations

import dataclasses
import sys
from collections import Counter

import torch

from .config import StreamConfig
from .errors import StreamBPError, source_line, op_name
from .passes.graphs import hint, per_token
from .passes.schedule import chunk_size
from .passes.units import _UNITS, UNIT


@dataclasses.dataclass
class Report:
    seq_dim: list            # per graph: the sequence length found (None if none)
    attention_sites: list    # AttentionSite objects, all graphs
    regions: list            # Region objects
    plan: list               # RegionPlan objects that stream
    not_streamed: list       # (region or op, reason) pairs
    classes: Counter
    saved: list              # names of the tensors the streamed regions save
    estimated_peak_bytes: int
    analyses: list
    moved: list = dataclasses.field(default_factory=list)  # sequence slices moved in front of the head
    caveats: list = dataclasses.field(default_factory=list)  # (region, what limits its streaming) pairs
    settings: dict = dataclasses.field(default_factory=dict)  # the compile settings explained: dynamic, options
    fallbacks: list = dataclasses.field(default_factory=list)  # (region, cause): streamed regions that ran whole
    units: list = dataclasses.field(default_factory=list)  # (Function and line, where it runs): one op each
    storage: list = dataclasses.field(default_factory=list)  # offload.StorePlan of each layer whose inputs leave the device or are rebuilt
    _later: object = dataclasses.field(default=None, repr=False)  # () -> Report for dynamic=None's later lengths
    _memory: object = dataclasses.field(default=None, repr=False)  # the memory model's summary, made on first use
    training_graphs: int = 1   # graphs with a backward that the explained call ran
    eager: list = dataclasses.field(default_factory=list)  # what Dynamo runs eagerly around the graphs, as warned

    def memory(self):
        """(T, layer chunk, head chunk, predicted step peak, [(bytes, role, module, source)], the
        storage of layer inputs chosen under ``offload="auto"`` or None) of the explained call, from
        the memory model of its step (``streamfx.plan_memory``); None where no region streams.
        Computed on first use."""
        if self._memory is None:
            # (sized as the compile the options ask for runs its chunk graphs, not as the FX
            # graphs the report's own compile ran)
            codegen = StreamConfig.from_options(self.settings["options"] or None).codegen \
                if "options" in self.settings else None
            from .membudget import one_graph_step

            one_graph_step(self.training_graphs, "the memory model")
            self._memory = _step_memory(self.analyses, codegen)
        return self._memory or None

    def memory_lines(self) -> list:
        try:
            m = self.memory()
        except Exception as e:  # noqa: BLE001 - the report explains; a model it cannot size is said so
            return [f"  predicted step peak: not available ({type(e).__name__}: {str(e).splitlines()[0][:200]})"]
        if m is None:
            return []
        from .membudget import gib, summarize

        from .offload import describe_storage

        T, c, h, peak, rows, storage = m
        lines = [f"  chunk sizes at T={T}: {c} tokens per layer chunk, {h} tokens per head chunk",
                 *([f"  at T={T}: {describe_storage(*storage)} (chosen for the memory budget)"] if storage else []),
                 f"  predicted step peak at T={T}: {gib(peak)} above what the step starts with; largest terms:"]
        return lines + ["    " + line for line in summarize(rows, 6)]

    def _budget_chunk(self, plan):
        """Where a memory budget sizes the chunks of ``plan`` (a ``memory_budget``, or a GPU's free
        memory): the chunk it chose at the explained length (``memory``), True at a symbolic length
        (chosen per call); None where the fixed rules size them."""
        policy = next((prog.policy for a in self.analyses for _, prog in getattr(a, "programs", ())
                       if prog.policy is not None), None)
        if policy is None or (policy.config.chunk_size if plan.kind == "layer" else policy.config.head_chunk_size):
            return None   # (no budget, or the user's fixed size)
        if not isinstance(plan.length, int):
            return True
        try:
            m = self.memory()
        except Exception:  # noqa: BLE001 - (memory_lines says why the model is not available)
            return None
        if m is None or m[0] != plan.length:
            return None
        return m[1] if plan.kind == "layer" else m[2]

    @property
    def later_lengths(self) -> "Report | None":
        """With ``dynamic=None`` (torch.compile's default) the first length compiles with static
        sizes and a new length recompiles with a symbolic one: what that compile streams (computed
        on first access). None for ``dynamic=False`` (each length compiles as the first) and
        ``dynamic=True`` (this report is already the symbolic compile)."""
        if callable(self._later):
            self._later = self._later()
        return self._later

    def __str__(self) -> str:
        lines = ["streamfx report"]
        if self.settings:
            lines.append(f"  compile settings: dynamic={self.settings.get('dynamic')}, "
                         f"options {self.settings.get('options') or {}}")
        lines.append(f"  sequence length: {', '.join(map(str, self.seq_dim)) or 'not found'}")
        lines.append(f"  node classes (forward): {dict(self.classes)}")
        lines.append(f"  attention sites: {len(self.attention_sites)}")
        for s in self.attention_sites:
            lines.append(f"    {s.describe(names=False)}")
        for m in self.moved:
            lines.append(f"  moved: {m.describe()}")
        lines.append(f"  regions: {len(self.regions)}")
        for r in self.regions:
            lines.append(f"    {r.describe(names=False)}")
        lines.append("  streamed:" + ("" if self.plan else " nothing"))
        for p in self.plan:
            lines.append(f"    {p.describe(names=False, budget=self._budget_chunk(p))}")
        lines.append("  saved for backward by streamed regions:" + ("" if self.saved else " nothing"))
        for what, count in Counter(self.saved).items():
            lines.append(f"    {what}" + (f" (x{count})" if count > 1 else ""))
        lines += self.memory_lines()
        if self.storage:
            lines.append(f"  layer inputs: {self.storage[0].options.describe()}")
            for sp in self.storage:
                lines.append(f"    {sp.describe()}")
        if self.units:
            kinds = {"gradient hooks" if what.startswith("register_hook ") else "torch.autograd.Functions"
                     for what, _ in self.units}
            lines.append(f"  {' and '.join(sorted(kinds, reverse=True))}, each one op with its own backward:")
            for what, where in self.units:
                lines.append(f"    {what}: {where}")
        for where, why in self.caveats:
            lines.append(f"  {where} streams, but {why}")
        lines += _pairs("  not streamed:", self.not_streamed, "    ")
        if self.eager:
            lines.append("  run eagerly, outside every graph the backend is given:")
            lines += [f"    {m.removeprefix('streamfx: ')}" for m in self.eager]
        lines += _pairs(f"  ran whole at run time ({len(self.fallbacks)}: a chunk failed; strict=True raises):",
                        self.fallbacks, "    ")
        later = self.later_lengths
        if later is not None:
            lines.append("  later lengths (dynamic=None recompiles a new sequence length or batch size with "
                         "symbolic sizes):")
            lines.append("    streamed:" + (" nothing" if not later.plan else ""))
            for p in later.plan:
                lines.append(f"      {p.describe(names=False, budget=later._budget_chunk(p))}")
            lines += _pairs("    not streamed:", later.not_streamed, "      ")
            lines += [f"    run eagerly: {m.removeprefix('streamfx: ')}" for m in later.eager if m not in self.eager]
        elif self.settings.get("dynamic") is False:
            lines.append("  later lengths: dynamic=False compiles every new sequence length or batch size again, "
                         "with static sizes, as above")
        return "\n".join(lines)


_UNSET = object()


def explain(model, *args, options=_UNSET, dynamic=_UNSET, **kwargs) -> Report:
    """Compile ``model`` with the streambp backend, run one forward with the given inputs, and
    report what the passes found, for the compile settings the run uses: ``options`` (the
    backend's) and ``dynamic`` (``torch.compile``'s, default None as there). A model prepared with
    ``streamfx.prepare`` (or ``StreamBPCallback``) is explained with the settings it was prepared
    with unless they are given here. Chunk graphs run as FX graphs (``codegen="eager"``): what
    streams is decided before code generation, on the graphs the options' codegen reads (for
    Inductor's, after its pre-grad and joint-graph passes). With ``dynamic=None`` the report also
    holds what a later length (compiled with symbolic sizes) streams: ``report.later_lengths``.
    Gradients are enabled so the joint graph is built; no backward runs and the model is left
    unchanged."""
    state = None
    if "streamfx.trainers" in sys.modules and isinstance(model, torch.nn.Module):  # (only it prepares models)
        state = sys.modules["streamfx.trainers"].state_of(model)
    if options is _UNSET:
        options = _prepared_options(state) if state is not None else None
    if dynamic is _UNSET:
        dynamic = state.dynamic if state is not None else None
    if dynamic not in (None, True, False):
        raise StreamBPError(f"dynamic must be None, True or False (as for torch.compile), got {dynamic!r}")
    said: set = set()   # the causes warned, shared by every graph of the first and later traces
    report, records = _explain_once(model, args, kwargs, options, dynamic, state, said=said)
    report.settings = {"dynamic": dynamic, "options": dict(options or {})}
    if dynamic is None:
        def later():
            # the call a later length makes: the same function called again at other sizes, after
            # this one (its records), so what changed turns symbolic and what did not stays as it
            # is (an int such as a resumed frame's logits_to_keep); without inputs to resize, every
            # size symbolic
            resized = later_inputs(args, kwargs, report.seq_dim)
            try:
                if resized is not None:
                    r, _ = _explain_once(model, *resized, options, None, state, records=records, said=said)
                    if any(isinstance(t, torch.SymInt) for t in r.seq_dim):
                        r.settings = {"dynamic": None, "options": dict(options or {})}
                        return r
                r, _ = _explain_once(model, args, kwargs, options, True, state, said=said)
            except Exception as e:  # noqa: BLE001 - reported, not raised: the first report stands
                r = build_report([])
                r.not_streamed.append(("compile", f"compiling with symbolic sizes failed: {type(e).__name__}: "
                                                  f"{str(e).splitlines()[0][:300] if str(e) else ''}"))
            r.settings = {"dynamic": True, "options": dict(options or {})}
            return r

        report._later = later
    return report


def later_inputs(args, kwargs, lengths) -> tuple | None:
    """``(args, kwargs)`` as a later call of a training run passes them: every dim of the sequence
    length T (``lengths``: the static ones a report found) cut to a shorter T' (a prefix: masks,
    labels and positions stay consistent), and the batch (dim 0 of the tensors that hold T after
    it) one row longer (its first row again). T' is the longest that equals no other size of the
    inputs, which Dynamo would take for the same symbol. None without such a T or T'."""
    leaves = [x for x in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]
    held = Counter(n for x in leaves for n in x.shape)
    T = max((n for n in lengths if isinstance(n, int) and held[n]), key=lambda n: held[n], default=None)
    if T is None:
        return None
    B = Counter(x.shape[0] for x in leaves if T in x.shape[1:]).most_common(1)
    B = B[0][0] if B else None
    others = {n for x in leaves for n in x.shape if n not in (T, B)} | ({B + 1} if B is not None else set())
    short = next((n for n in range(T - 1, 1, -1) if n not in others), None)
    if short is None:
        return None

    def resize(x: torch.Tensor) -> torch.Tensor:
        for d, n in enumerate(x.shape):
            if n == T:
                x = x.narrow(d, 0, short)
        if B is not None and x.dim() and x.shape[0] == B:
            x = torch.cat([x, x[:1]])
        return x.detach().requires_grad_(x.requires_grad)

    return torch.utils._pytree.tree_map_only(torch.Tensor, resize, (args, kwargs))


def _prepared_options(state) -> dict:
    from .trainers import _effective_options

    return _effective_options(state)


def _explain_once(model, args, kwargs, options, dynamic, state, records=None, said=None) -> tuple:
    """(report, Dynamo's automatic-dynamic records after the call): one traced call, in a
    process whose earlier calls are ``records`` (None: the model's first call). ``said``: the
    causes already warned (a refusal that holds at the first length and at later ones is said
    once; the reports list it for each)."""
    from . import frames, membudget, runtime
    from .backend import compile_graph
    from .session import Session

    user = StreamConfig.from_options(options)   # (its codegen's graphs are the ones analysed)
    config = dataclasses.replace(user, codegen="eager", mode="default", inductor_options=None)
    collected: list = []

    trains: set = set()   # the graphs with a backward that ran

    def capture(gm, example_inputs):
        session = Session(config, collected)
        session.passes_of, session.inductor_patches = user.codegen, user.inductor_patches
        if said is not None:
            session.warned = said
        fn = compile_graph(gm, example_inputs, config, session)
        return membudget.training_graph(fn, example_inputs, trains)

    # a prepared model's own compiled call is set aside while it is explained
    target = state.target if state is not None else None
    saved = target.__dict__.get("_compiled_call_impl") if target is not None else None
    if target is not None:
        target._compiled_call_impl = None
    # fresh tensor objects: a symbolic compile marks the tensors it saw as dynamic
    # (_dynamo_propagated_dynamic_indices), and a later compile given the same objects would be
    # symbolic too; the caller's tensors must not change what their own run compiles
    args, kwargs = torch.utils._pytree.tree_map_only(torch.Tensor, _fresh, (args, kwargs))
    try:
        with torch.enable_grad(), runtime.analysis(), frames.collected() as eager:   # (no backward: no layer input stored)
            _, records = frames.traced_call(model, capture, args, kwargs, records=records, dynamic=dynamic)
    finally:
        if target is not None:
            target._compiled_call_impl = saved
    report = build_report(collected)
    report.training_graphs = len(trains)
    report.eager = eager
    return report, records


def _fresh(x: torch.Tensor) -> torch.Tensor:
    y = x.detach()
    return y.requires_grad_() if x.requires_grad else y


def build_report(analyses) -> Report:
    sites, regions, plans, refusals, saved, moved, caveats, fallbacks, units, storage = [], [], [], [], [], [], [], [], [], []
    classes: Counter = Counter()
    peak = 0
    for a in analyses:
        sites += a.sites
        regions += a.regions
        plans += a.plans
        moved += a.moved
        for n in a.fwd_nodes:
            if n.op == "call_function":
                classes[a.classes.get(n)] += 1
        for name, err in a.refusals:
            refusals.append((name, err.describe()))
        for name, err in a.whole:
            refusals.append((name, f"runs whole, at no cost in memory: nothing in it is wider per token than the "
                                   f"hidden state it starts from ({err.describe()})"))
        caveats += [(name, err.describe()) for name, err in a.notes]
        for n in a.unknown_mixing():
            if any(n in r.nodes for r in a.regions):
                refusals.append((op_name(n), f"mixes tokens other than causal attention{source_line(n)}"))
        for n in a.fwd_nodes:
            if n.op == "call_function" and n.target is UNIT:
                where = next((p.name for p in a.plans if n in p.nodes), None)
                units.append((f"{_UNITS[n.args[0]].name}{source_line(n)}",
                              f"per chunk in {where}" if where else "whole, outside the streamed regions"))
        for p in a.plans:
            saved += [_saved_name(p, x, spec) for x, spec in zip(p.inputs, p.in_specs) if spec.sliced]
            peak += _chunk_peak(p)
        for _, prog in a.programs:
            if getattr(prog, "keep", None) is not None:
                saved.append(f"{prog.name}: its attention's output and log-sum-exp (attention='keep')")
            elif getattr(prog, "keep_refused", None):
                caveats.append((prog.name, f"attention='keep' keeps nothing: {prog.keep_refused}; "
                                           f"its backward recomputes the attention"))
        fallbacks += [(prog.name, f"{phase}: {cause}") for _, prog in a.programs for phase, cause in prog.fallbacks]
        storage += getattr(a, "stores", [])
    return Report([a.seq_len for a in analyses], sites, regions, plans, refusals, classes, saved, peak, analyses,
                  moved, caveats, fallbacks=fallbacks, units=units, storage=storage)


def _pairs(title: str, pairs, indent: str) -> list:
    """A titled section of (where, why) lines; nothing when there are none."""
    return [title] + [f"{indent}{where}: {why}" for where, why in pairs] if pairs else []


def _saved_name(plan, x, spec) -> str:
    """A tensor a streamed region keeps, as the user knows it: its role, module and source line."""
    from .memory import region_module, saved_role, where

    role = saved_role(plan, spec, x.meta.get("val"))
    src = where(x)
    return f"{role} of {region_module(plan.nodes) or plan.name}" + (f" ({src})" if src else "")


def _step_memory(analyses, codegen: str | None = None):
    """The memory model's prediction for the last analysed graph that streams (see ``memory``),
    its chunk graphs sized as ``codegen`` runs them (default: as its programs say)."""
    from . import membudget

    a = next((a for a in reversed(analyses) if getattr(a, "graphs", None) is not None), None)
    if a is None:
        return False
    length = next(iter(a.plans)).length
    T = int(length.node.hint) if isinstance(length, torch.SymInt) else int(length)
    device = membudget._device(a)
    model = membudget.step_models(a, device, codegen)[0]
    # Under a budget (a memory_budget, or a GPU's free memory) the chunk sizes and, with
    # offload="auto", the storage of layer inputs are chosen as the user's compile chooses them:
    # from this model (its chunk graphs sized as that compile runs them), not the report's own.
    policy = next((prog.policy for _, prog in a.programs if prog.policy is not None), None)
    if policy is not None:
        policy = membudget.BudgetPolicy(model, policy.config, policy.device, policy.held_fn,
                                        membudget.Storages(model, a, device, codegen))
    c = next((chunk_size(prog.kind, T, prog.chunk_size, policy) for p, prog in a.programs if p.kind == "layer"), T)
    h = next((chunk_size(prog.kind, T, prog.chunk_size, policy) for p, prog in a.programs if p.kind == "head"), T)
    storage = policy.storage(T) if policy is not None and any(sp.tier == "auto" for sp in a.stores) else None
    if storage is not None:
        model = policy.storages.model(storage)
    peak, rows = model.breakdown(T, c, h)
    return T, c, h, peak, rows, storage


def _chunk_peak(p) -> int:
    """Bytes of the largest per-chunk tensor of a plan, times three (value, grad, one temporary)."""
    widths = [per_token(n, p.sd, nbytes=True) for n in p.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    widest = max([w for w in widths if w != float("inf")] + [0])
    return 3 * widest * p.chunk_at(hint(p.length))
