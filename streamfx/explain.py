"""``streamfx.explain(model, *args, **kwargs)``: what the backend sees and decides, in words."""
from __future__ import annotations

import dataclasses
from collections import Counter

import torch

from .config import StreamConfig
from .errors import source_line, op_name
from .passes.graphs import hint, per_token


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

    def __str__(self) -> str:
        lines = ["streamfx report"]
        lines.append(f"  sequence length: {', '.join(map(str, self.seq_dim)) or 'not found'}")
        lines.append(f"  node classes (forward): {dict(self.classes)}")
        lines.append(f"  attention sites: {len(self.attention_sites)}")
        for s in self.attention_sites:
            lines.append(f"    {s.describe()}")
        for m in self.moved:
            lines.append(f"  moved: {m.describe()}")
        lines.append(f"  regions: {len(self.regions)}")
        for r in self.regions:
            lines.append(f"    {r.describe()}")
        lines.append("  streamed:" + ("" if self.plan else " nothing"))
        for p in self.plan:
            lines.append(f"    {p.describe()}")
        lines.append(f"  saved for backward by streamed regions: {self.saved or 'nothing'}")
        lines.append(f"  estimated peak of streamed regions: {self.estimated_peak_bytes / 2**20:.1f} MiB")
        if self.not_streamed:
            lines.append("  not streamed:")
            for where, why in self.not_streamed:
                lines.append(f"    {where}: {why}")
        return "\n".join(lines)


def explain(model, *args, options=None, **kwargs) -> Report:
    """Compile ``model`` with the streambp backend (eager codegen), run one forward with the given
    inputs, and report what the passes found. Gradients are enabled so the joint graph is built;
    no backward runs and the model is left unchanged."""
    from .backend import compile_graph
    from .session import Session

    config = dataclasses.replace(StreamConfig.from_options(options), codegen="eager")
    collected: list = []

    def capture(gm, example_inputs):
        return compile_graph(gm, example_inputs, config, Session(config, collected))

    compiled = torch.compile(model, backend=capture, dynamic=False)
    with torch.enable_grad():
        compiled(*args, **kwargs)
    return build_report(collected)


def build_report(analyses) -> Report:
    sites, regions, plans, refusals, saved, moved = [], [], [], [], [], []
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
        for n in a.unknown_mixing():
            if any(n in r.nodes for r in a.regions):
                refusals.append((op_name(n), f"mixes tokens other than causal attention{source_line(n)}"))
        for p in a.plans:
            saved += [x.name for x in p.saved]
            peak += _chunk_peak(p)
    return Report([a.seq_len for a in analyses], sites, regions, plans, refusals, classes, saved, peak, analyses,
                  moved)


def _chunk_peak(p) -> int:
    """Bytes of the largest per-chunk tensor of a plan, times three (value, grad, one temporary)."""
    widths = [per_token(n, p.sd, nbytes=True) for n in p.nodes if isinstance(n.meta.get("val"), torch.Tensor)]
    widest = max([w for w in widths if w != float("inf")] + [0])
    return 3 * widest * p.chunk_at(hint(p.length))
