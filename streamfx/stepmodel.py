"""A training step's memory as a function of the sequence length T and the chunk sizes.

``StepModel`` chains the liveness of the partitioned forward graph, the tensors it saves, and
the backward graph (``memory.Live``); streamed regions add their working set while they run
(``region_working``). ``peak(T, chunks)`` is the step's peak above what was held before it
(parameters and inputs); parameter gradients count, since the step allocates them
(``zero_grad(set_to_none=True)``). Baselines come from the same joint graph partitioned
without streaming: as is (no checkpointing), and with every layer region's saved tensors
dropped after the forward and recomputed at the layer's backward (activation checkpointing).
"""
from __future__ import annotations

import dataclasses
import functools
import operator
import re

import sympy
import torch

from . import memory
from .memory import Live, chunk_curve, evaluate, nbytes_expr, peak_of

# the region ops: the phase whose working set each one's step holds (None: no streamed work)
# and what its values are (a head that keeps its gradients from the forward returns them after
# its outputs, and its backward, ``region_scale``, scales them; a layer whose inputs leave the
# device runs as ``region_stored``, ``streamfx.offload``)
REGION_OPS = {"streamfx::region": ("forward", "output"),
              "streamfx::region_backward": ("backward", "gradients (input and parameters)"),
              "streamfx::region_scale": (None, "gradients (input and parameters)"),
              "streamfx::region_stored": ("forward", "output"),
              "streamfx::region_stored_backward": ("backward", "gradients (input and parameters)")}
_LAYER_INDEX = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")   # the first index of a module path: the layer


def _op(n) -> str:
    return getattr(getattr(n.target, "_schema", None), "name", "") if n.op == "call_function" else ""


# ---- a streamed region's working set ----------------------------------------------------------------
@dataclasses.dataclass
class RegionWork:
    """Working set of one streamed region program (``runtime.RegionProgram``) at chunk c, length T."""
    prog: object
    kind: str                     # "layer" | "head"
    module: str                   # the module path the region's code is in
    window: int | None = None     # a layer whose chunks read at most c + window - 1 keys (sliding)
    fused: bool = False           # its chunk graphs run as Inductor's code (``memory._fused_steps``)

    @functools.cached_property
    def _curves(self):
        p, fused = self.prog, self.fused
        if self.kind != "layer":
            return (chunk_curve(p.chunk, p.grad_inputs, True, fused), chunk_curve(p.chunk, fused=fused), None, None)
        n = len(p.in_specs)
        q_grads = list(p.grad_inputs) + list(range(n, len(p.chunk.slots)))
        return (chunk_curve(p.chunk, q_grads, True, fused), chunk_curve(p.chunk, fused=fused),
                chunk_curve(p.kv, p.grad_inputs, True, fused), chunk_curve(p.kv, fused=fused))

    def _fp32_buffers(self, sliced: bool, T: int) -> int:
        """Bytes of the fp32 gradient buffers of the region's 16-bit inputs at length T (``runtime``):
        per-token inputs (``sliced``) summed over chunks ("prefix") have one of the whole length
        beside the gradient they are cast to at the end (those read by one chunk are gathered in
        their own dtype, the gradient returned: ``runtime._row_grad_dtype``); whole inputs
        (weights) a sum over the chunks when there is more than one. Inputs with sizes other than
        the tokens' written as symbols are left out."""
        p, total = self.prog, 0
        for i in p.grad_inputs:
            slot = p.chunk.slots[i]
            if sliced and p.in_specs[i].kind in ("chunk", "qk"):
                continue
            if p.in_specs[i].sliced == sliced and slot.dtype in (torch.bfloat16, torch.float16) \
                    and all(isinstance(d, int) or d in ("q", "k") for d in slot.shape):
                total += 4 * functools.reduce(operator.mul, [T if isinstance(d, str) else d for d in slot.shape], 1)
        return total

    def _own_weight_gradients(self, sixteen_bit: bool, graph=None) -> int:
        """Bytes of the region's weight gradients (inputs read whole) that are its one chunk's
        own: the region's outputs, already counted in the step while it runs, and made by the
        chunk (in its curve). ``sixteen_bit``: whether 16-bit ones count (the backward keeps a
        first gradient in its dtype; a head's forward copies 16-bit ones to fp32)."""
        p, total = self.prog, 0
        used = None if graph is None else [bool(x.users) for x in graph.gm.graph.find_nodes(op="placeholder")]
        for i in p.grad_inputs:
            slot = p.chunk.slots[i]
            if not p.in_specs[i].sliced and all(isinstance(d, int) for d in slot.shape) \
                    and (sixteen_bit or slot.dtype not in (torch.bfloat16, torch.float16)) \
                    and (used is None or (i < len(used) and used[i])):
                total += slot.dtype.itemsize * functools.reduce(operator.mul, slot.shape, 1)
        return total

    def terms(self, phase: str, c: int, T: int) -> list:
        """[(what, bytes)] the region holds while it runs (phase "forward" or "backward")."""
        if phase == "rebuild":   # keep_every: a streamed forward per layer of the group, then the backward
            forward, backward = self.terms("forward", c, T), self.terms("backward", c, T)
            if sum(b for _, b in forward) <= sum(b for _, b in backward):
                return backward
            return [(f"rebuilding its group's inputs: {what}", b) for what, b in forward]
        train, nograd, kv_train, kv_nograd = self._curves
        c = min(c, T)
        sums = []
        if phase == "backward":
            sums = [(what, b) for what, b in (
                ("fp32 sums of its weights' gradients over the chunks", self._fp32_buffers(False, T) if c < T else 0),
                ("fp32 gradients of its per-token inputs", self._fp32_buffers(True, T))) if b]
        if self.kind != "layer":
            # a head whose forward computes its gradients (``head_grad``) runs each chunk's
            # backward there; its backward only scales what the forward kept
            if getattr(self.prog, "seeds", None) is not None:
                return [(f"logits and loss of one chunk ({c} tokens, with its gradients)", train(c))] \
                    + self._own(c, T, sixteen_bit=False)
            if phase == "backward":
                return [(f"logits and loss of one chunk ({c} tokens, with its gradients)", train(c))] + sums \
                    + self._own(c, T)
            return [(f"logits of one chunk ({c} tokens)", nograd(c))]
        kv = kv_nograd.outputs_at(T)
        out = [("keys and values of the whole sequence", kv)]
        k = T if self.window is None else min(T, c + self.window - 1)   # the keys the widest chunk reads
        if phase == "backward":
            out.append(("gradient accumulators of the keys and values (fp32, fp64 for fp64)", kv_nograd.accumulators_at(T)))
            out.append((f"one chunk's recomputed forward and backward ({c} tokens against {k} keys)",
                        self._backward_chunk(train, kv_train, c, k, T)))
            out += sums + self._own(c, T)
        else:
            out.append((f"one chunk's forward ({c} tokens against {k} keys)", max(nograd(c, k), kv_nograd(c))))
        return out

    def _own(self, c: int, T: int, sixteen_bit: bool = True) -> list:
        """One chunk: its weights' gradients are the chunk's, counted once (a backward keeps them in
        their dtype, ``runtime._sum_into`` ``late``; a head's forward, fp32 ones: ``sixteen_bit``)."""
        own = self._own_weight_gradients(sixteen_bit) if c >= T else 0
        return [("less its weights' gradients, its outputs, made by the chunk", -own)] if own else []

    def _backward_chunk(self, train, kv_train, c: int, k: int, T: int) -> int:
        """A layer chunk's backward: its queries' (recomputed against the keys), then its keys' and
        values' (with one chunk, the query part's weight gradients are held by then)."""
        held = self._own_weight_gradients(True, self.prog.chunk) if c >= T else 0
        return max(train(c, k), held + kv_train(c))

    def bytes(self, phase: str, c: int, T: int) -> int:
        return sum(b for _, b in self.terms(phase, c, T))


# ---- the step -------------------------------------------------------------------------------------
class _Stored:
    """The liveness key of a layer input held by the store outside the graphs' tensors."""

    def __init__(self, name: str, role: str, module: str):
        self.name, self.role, self.module = name, role, module


class StepModel:
    """Liveness of a step's forward and backward graphs with the regions' working sets.

    ``fw``, ``bw``: the partitioned graphs; ``works``: {region op key: RegionWork};
    ``seq``: the shape symbols of the sequence length; ``fixed``: the other symbols' values;
    ``ckpt``: names of forward nodes recomputed in the backward (activation checkpointing);
    ``free``: names of nodes whose tensors count as never made; ``stores``: {region key:
    ``offload.StorePlan``} of the layers whose inputs leave AOTAutograd's saved tensors;
    ``dropped``: positions among the forward graph's outputs of the user outputs the caller drops
    after the forward (the logits beside the loss: they die there unless the backward reads them)."""

    def __init__(self, fw: torch.fx.Graph, bw: torch.fx.Graph, works: dict, seq: set, fixed: dict,
                 device: str = "cpu", ckpt: dict | None = None, free=frozenset(), stores: dict | None = None,
                 dropped=frozenset()):
        self.works, self.seq, self.fixed, self.device = works, seq, fixed, device
        self.fw_nodes = {n.name: n for n in fw.nodes}
        self.bw_graph = bw
        held = frozenset(fw.find_nodes(op="placeholder"))
        bw_inputs = [p for p in bw.find_nodes(op="placeholder") if p.name in self.fw_nodes]
        saved = {memory.base_of(self.fw_nodes[p.name]) for p in bw_inputs} - held
        ckpt = {n: layer for n, layer in (ckpt or {}).items() if n in self.fw_nodes}
        # a checkpointed layer keeps its outputs (the next layer's input) and recomputes the rest
        outputs = {n for n, layer in ckpt.items()
                   if any(ckpt.get(u.name) != layer for u in self.fw_nodes[n].users if u.op != "output")}
        recomputed = {memory.base_of(self.fw_nodes[n]) for n in set(ckpt) - outputs} & saved
        recomputed -= {memory.base_of(self.fw_nodes[n]) for n in outputs}
        outs = fw.output_node().args[0]
        gone = {memory.base_of(outs[i]) for i in dropped if i < len(outs) and isinstance(outs[i], torch.fx.Node)}
        gone -= saved | held
        fw_live = Live.of(fw, held=held, keep=frozenset(saved - recomputed), drop=frozenset(recomputed | gone))
        bw_live = Live.of(bw, held=frozenset(bw.find_nodes(op="placeholder")))
        # the backward's saved inputs are the forward's nodes: each dies after its last use there
        # (a base with several saved views, after the last of them); a checkpointed one is made
        # again at the first backward use of its layer's saved tensors
        last, first_of_layer = {}, {}
        for i, (n, _, _) in enumerate(bw_live.steps):
            for x in n.all_input_nodes:
                if x.op == "placeholder" and x.name in self.fw_nodes:
                    base = memory.base_of(self.fw_nodes[x.name])
                    last[base] = i
                    layer = ckpt.get(x.name)
                    if layer is not None and base in recomputed:
                        first_of_layer.setdefault(layer, i)
        born = {}
        for base in recomputed:
            layer = next((ckpt[n] for n in ckpt if n in self.fw_nodes and memory.base_of(self.fw_nodes[n]) is base), None)
            born.setdefault(first_of_layer.get(layer, 0), []).append((base, nbytes_expr(base.meta.get("val"))))
        steps = list(fw_live.steps)
        for i, (n, b, dies) in enumerate(bw_live.steps):
            steps.append((n, b + born.get(i, []), dies + [x for x, j in last.items() if j == i]))
        if free:   # tensors the modelled execution does not make (``membudget._causal_masks``)
            steps = [(n, [(x, b) for x, b in born if x.name not in free], dies) for n, born, dies in steps]
        self.forward_steps = len(fw_live.steps)
        self.region_steps = {}
        for i, (n, _, _) in enumerate(steps):
            phase = REGION_OPS.get(_op(n), (None,))[0]
            if phase is not None and n.args[0] in works:
                self.region_steps[i] = (works[n.args[0]], phase)
        self.host = []   # bytes of the layer inputs a step holds in pinned host memory (a GPU's "cpu" tier)
        if stores:
            self._stored_inputs(steps, stores)
        self.live = Live(steps)

    def _stored_inputs(self, steps: list, stores: dict) -> None:
        """Add to ``steps`` what the store of layer inputs holds (``streamfx.offload``), which
        AOTAutograd's saved tensors no longer show: an input held as a device copy (``kept``) lives
        from its layer's forward to its backward, as does, on a CPU device, the host copy of an
        input offloaded to the "cpu" tier; on a GPU, the copy to the host holds a device copy
        until the next layer's forward has run; an input read back from the tier lives from the
        stored backward before its own (read ahead,
        ``Store.prefetch_before``) to its own; inputs dropped by keep_every are rebuilt together at
        the backward of the last layer of their group, by a streamed forward of the layers between,
        and each lives until its own backward (the inputs the rebuild reads are read back then)."""
        at = {"forward": {}, "backward": {}}
        for i, (_, phase) in self.region_steps.items():
            n = steps[i][0]
            if _op(n).startswith("streamfx::region_stored") and n.args[0] in stores:
                at[phase][n.args[0]] = i
        fw_at, bw_at = at["forward"], at["backward"]
        successor = {sp.link[1]: k for k, sp in stores.items() if sp.dropped is not None and sp.link}

        def top(k):   # the last layer of k's group: its backward rebuilds the group's dropped inputs
            while k in successor:
                k = successor[k]
            return k

        def group_top(k):
            return top(k) if stores[k].dropped is not None else (top(successor[k]) if k in successor else None)

        cuda = str(self.device).startswith("cuda")
        for k, sp in stores.items():
            if k not in fw_at or k not in bw_at:
                continue
            n, (work, _) = steps[fw_at[k]][0], self.region_steps[fw_at[k]]
            fw_i, bw_i = fw_at[k], bw_at[k]
            g = group_top(k)
            read = max((j for j in bw_at.values() if j < bw_i), default=bw_i)
            if g is not None and g in bw_at:
                read = min(read, bw_at[g])
            for idx in sp.kept:   # (``offload="auto"``: a call whose inputs stay on the device)
                x = _Stored(f"{n.name}.kept{idx}", "layer input", work.module)
                steps[fw_i][1].append((x, nbytes_expr(n.args[1][idx].meta.get("val"))))
                steps[bw_i][2].append(x)
            for idx in sp.offloaded:
                b = nbytes_expr(n.args[1][idx].meta.get("val"))
                if sp.tier == "cpu" and not cuda:
                    x = _Stored(f"{n.name}.host{idx}", "layer input offloaded to host memory (its copy)", work.module)
                    steps[fw_i][1].append((x, b))
                    steps[bw_i][2].append(x)
                    continue
                if sp.tier == "cpu":
                    self.host.append(b)
                x = _Stored(f"{n.name}.read{idx}", f"layer input read back from the {sp.tier} tier", work.module)
                steps[read][1].append((x, b))
                steps[bw_i][2].append(x)
                if cuda:
                    x = _Stored(f"{n.name}.copy{idx}", "layer input being copied to host memory", work.module)
                    steps[fw_i][1].append((x, b))
                    steps[min((j for j in fw_at.values() if j > fw_i), default=fw_i)][2].append(x)
            if sp.dropped is not None and top(k) in bw_at:
                rebuild = bw_at[top(k)]
                x = _Stored(f"{n.name}.rebuilt", "layer input rebuilt for its backward (keep_every)", work.module)
                steps[rebuild][1].append((x, nbytes_expr(n.args[1][sp.dropped].meta.get("val"))))
                steps[bw_i][2].append(x)
                self.region_steps[rebuild] = (self.region_steps[rebuild][0], "rebuild")

    def host_bytes(self, T: int) -> int:
        """Pinned host memory the step's offloaded layer inputs take at length T (all of them at the
        end of the forward)."""
        subs = self.subs(T)
        return sum(evaluate(b, subs) for b in self.host)

    def subs(self, T: int) -> dict:
        return {**self.fixed, **{s: T for s in self.seq}}

    def timeline(self, T: int) -> list:
        """Bytes live at each step (``live.steps``) at length T, regions' working sets left out."""
        cache, key = self.__dict__.setdefault("_timelines", memory.Recent(memory.RECENT)), (T, self.device)
        if key not in cache:
            subs = self.subs(T)
            current, alive, out = 0, {}, []
            for n, born, dies in self.live.steps:
                for x, b in born:
                    b = memory.rounded(evaluate(b, subs), self.device)
                    alive[x] = alive.get(x, 0) + b
                    current += b
                out.append(current)
                for d in dies:
                    current -= alive.pop(d, 0)
            cache[key] = out
        return cache[key]

    def profile(self, T: int) -> tuple[int, list]:
        """(peak of the steps outside regions, [(bytes live while region step i runs, work, phase)])."""
        live = self.timeline(T)
        outside = max((b for i, b in enumerate(live) if i not in self.region_steps), default=0)
        return outside, [(live[i], *self.region_steps[i]) for i in sorted(self.region_steps)]

    @functools.cached_property
    def positions(self) -> list:
        """Each step's places in the step, named so that the same place in a model of more layers
        has the same name: (phase, "start" | "in" | "after", the last layer reached in that phase
        counted from one end: ("first", i) or ("last", i)). A layer has a name from each end it is
        not the far end of (the first layer: ("first", 0); the second of 4: ("first", 1) and
        ("last", 2)), so that a place between the two ends extrapolates from both: in the
        backward with offloaded inputs, the peak sits at the second layer (the gradients of every
        later layer held, with the inputs read ahead of the first layer). A step outside every
        layer (the embedding, the head, nodes no module claims) belongs to the last layer reached
        before it; a backward step to the layer whose forward it differentiates."""
        def index(path):
            m = _LAYER_INDEX.search(path or "")
            return int(m.group(1)) if m else None

        raw, regions, previous = [], {}, -1
        for i, (n, _, _) in enumerate(self.live.steps):
            if i in self.region_steps:
                # a layer region is the layer its module path names, else the one after the layer
                # region before it (a region's module is where most of its nodes come from: for
                # the last layer, with the final norm, that can be the model itself)
                work, phase = self.region_steps[i]
                if work.kind == "layer" and phase == "forward" and n.args[0] not in regions:
                    regions[n.args[0]] = index(work.module) if index(work.module) is not None else previous + 1
                li = regions.get(n.args[0]) if work.kind == "layer" else None
                previous = li if li is not None and phase == "forward" else previous
            elif i < self.forward_steps:
                li = index(memory.module_path(n))
            else:   # (a forward node recomputed in the backward names its layer, not the backward's place)
                li = index(memory.module_path(n, "fwd_nn_module_stack"))
            raw.append(li)
        layers = 1 + max((x for x in raw if x is not None), default=-1)
        out, last = [], None
        for i, li in enumerate(raw):
            phase = "forward" if i < self.forward_steps else "backward"
            if i == self.forward_steps:
                last = None
            where = "in" if li is not None else ("after" if last is not None else "start")
            last = li if li is not None else last
            if last is None:
                out.append(((phase, where, None),))
                continue
            ends = [("first", last)] if last < layers - 1 else []
            ends += [("last", layers - 1 - last)] if last > 0 or layers == 1 else []
            out.append(tuple((phase, where, e) for e in ends))
        return out

    def keyed_profile(self, T: int) -> dict:
        """``profile`` per place (``positions``): {place: (peak outside regions, [(bytes, work, phase)])}."""
        cache, key = self.__dict__.setdefault("_keyed", memory.Recent(memory.RECENT)), (T, self.device)
        if key not in cache:
            cache[key] = self._keyed_profile(T)
        return cache[key]

    def _keyed_profile(self, T: int) -> dict:
        out = {}
        for i, (b, places) in enumerate(zip(self.timeline(T), self.positions)):
            for place in places:
                entry = out.setdefault(place, [0, []])
                if i in self.region_steps:
                    entry[1].append((b, *self.region_steps[i]))
                else:
                    entry[0] = max(entry[0], b)
        return {k: tuple(v) for k, v in out.items()}

    def keyed_peaks(self, T: int, layer_chunk: int | None = None, head_chunk: int | None = None) -> dict:
        """{place: the step's peak there} (``peak`` is their maximum). Linear in the number of
        layers at every place a model of 3 layers shares with one of 4 (the layers are alike), which
        is how ``plan.Extrapolated`` predicts deep models from shallow traces."""
        chunks = {"layer": layer_chunk, "head": head_chunk}
        return {k: max([o] + [b + w.bytes(ph, chunks[w.kind] or T, T) for b, w, ph in ins])
                for k, (o, ins) in self.keyed_profile(T).items()}

    def peak(self, T: int, layer_chunk: int | None = None, head_chunk: int | None = None) -> int:
        outside, inside = self.profile(T)
        chunks = {"layer": layer_chunk, "head": head_chunk}
        return max([outside] + [base + work.bytes(phase, chunks[work.kind] or T, T) for base, work, phase in inside])

    def fits(self, T: int, budget: int, kind: str, c: int, profile=None) -> bool:
        """Whether the steps of ``kind``'s regions stay within ``budget`` at chunk ``c``."""
        outside, inside = profile or self.profile(T)
        return outside <= budget and all(base + work.bytes(phase, c, T) <= budget
                                         for base, work, phase in inside if work.kind == kind)

    def breakdown(self, T: int, layer_chunk: int | None = None, head_chunk: int | None = None) -> tuple[int, list]:
        """(peak, [(bytes, role, module, source)]): what is live at the step's peak."""
        subs = self.subs(T)
        chunks = {"layer": layer_chunk, "head": head_chunk}

        def extra(i):
            if i not in self.region_steps:
                return 0
            work, phase = self.region_steps[i]
            return work.bytes(phase, chunks[work.kind] or T, T)

        peak, at, alive = peak_of(self.live, subs, extra)
        rows = []
        for node, b in alive.items():
            if b:
                rows.append((b, *self.describe(node)))
        if at in self.region_steps:
            work, phase = self.region_steps[at]
            for what, b in work.terms(phase, chunks[work.kind] or T, T):
                rows.append((b, f"{work.kind} {phase}: {what}", work.module, ""))
        rows.sort(key=lambda r: -r[0])
        return peak, rows

    def describe(self, node) -> tuple[str, str, str]:
        """(role, module, source line) of a tensor of the step."""
        if isinstance(node, _Stored):
            return (node.role, node.module, "")
        role = getattr(self, "roles", {}).get(node.name)
        if role is not None:
            return role
        if isinstance(node, memory._Workspace):
            op = getattr(node.node.target, "__name__", str(node.node.target)).split(".")[0]
            return (f"{op} workspace (inside the op)", memory.module_path(node.node), memory.where(node.node))
        parent = node.args[0] if node.target is operator.getitem else node
        what = REGION_OPS.get(_op(parent), (None, None))[1]
        if what is not None:
            work = self.works.get(parent.args[0])
            prog = getattr(work, "prog", None)
            if what == "output" and getattr(prog, "seeds", None) is not None:
                if node.target is not operator.getitem:   # (the op's values together)
                    what = "output and gradients computed in the forward"
                elif node.args[1] >= prog.n_outputs:
                    what = "gradients computed in the forward (input and parameters)"
            if what == "output" and getattr(prog, "keep", None) is not None:
                if node.target is not operator.getitem:
                    what = "output and the attention kept for the backward"
                elif node.args[1] >= prog.n_outputs:
                    what = ("attention output kept for the backward" if (node.args[1] - prog.n_outputs) % 2 == 0
                            else "attention log-sum-exp kept for the backward")
            return (f"{(work.kind if work else 'region')} {what}", work.module if work else "", "")
        # (a backward node: named by the forward op it differentiates, its module and line)
        fwd = self._forward_of(node) if node.graph is self.bw_graph else None
        src = memory.where(node) or memory.where(fwd)
        module = (memory.module_path(node) or memory.module_path(node, "fwd_nn_module_stack")
                  or memory.module_path(fwd))   # (torch 2.11 copies no module stack onto backward nodes)
        v = node.meta.get("val")
        shape = "[" + ", ".join(self.size_text(s) for s in v.shape) + "]" if isinstance(v, torch.Tensor) else ""
        op = getattr(node.target, "__name__", str(node.target)).split(".")[0]
        if any(u.op == "output" for u in node.users) and node.graph is self.bw_graph:
            return (f"parameter gradient {shape}", module, src)
        if node.graph is self.bw_graph:
            return (f"backward {op} result {shape}", module, src)
        return (f"{op} result {shape}", module, src)

    @functools.cached_property
    def _by_seq_nr(self) -> dict:
        """AOTAutograd's ``seq_nr`` -> the first forward node with it (the op a backward node with
        that ``seq_nr`` differentiates)."""
        out = {}
        for n in self.fw_nodes.values():
            if "seq_nr" in n.meta:
                out.setdefault(n.meta["seq_nr"], n)
        return out

    def _forward_of(self, node):
        """The forward node a backward node differentiates, or None."""
        return self._by_seq_nr.get(node.meta.get("seq_nr"))

    def size_text(self, s) -> str:
        if isinstance(s, int):
            return str(s)
        expr = s.node.expr
        return str(expr.xreplace({x: sympy.Symbol("T") for x in self.seq}).xreplace(
            {x: v for x, v in self.fixed.items()}))
