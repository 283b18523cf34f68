"""One backend compilation: runs the pipeline at partition time, keeps reports and dumps."""
from __future__ import annotations

import itertools
import warnings

import torch
from torch._dynamo.exc import RestartAnalysis

from streamfx.passes import pipeline, stops, verify
from streamfx.passes.graphs import primals

from .config import StreamConfig
from .decompose import decompose_kept
from .errors import CannotStream, StreamBPError, failure

_graph_ids = itertools.count()
DDP_CUT = ("the graph is a piece of one that Dynamo's DDPOptimizer cut where a DDP gradient bucket filled, "
           "which can separate a layer's attention from its query/key/value producers; set "
           "`torch._dynamo.config.optimize_ddp = False` (one graph, no overlap of the all-reduce with "
           "the backward) or raise DDP's `bucket_cap_mb` so that each bucket holds whole decoder layers")


class DetachOutputs(Exception):
    """Raised at partition time when user outputs will be dropped (logits): the backend detaches
    them in the Dynamo graph and traces again, so no gradient buffer for them ever exists."""

    def __init__(self, indices):
        super().__init__(indices)
        self.indices = self.planned = indices   # (``planned``: as ``KeepOutputs`` names it)


class KeepOutputs(Exception):
    """Raised at partition time when a graph traced with user outputs detached (guessed,
    ``backend.likely_dropped``, or after ``DetachOutputs``) does not drop them all (its plans keep
    one, or its rewrite failed): the backend compiles the graph as Dynamo captured it, so that
    those outputs keep their gradients. ``planned``: the outputs the plans drop, where they
    were made (the backend traces again with those detached); None where streaming failed."""

    def __init__(self, indices, planned=None):
        super().__init__(indices)
        self.indices, self.planned = indices, planned


class Session:
    """State shared by the backend call, the partition hook and the output wrapper."""

    def __init__(self, config: StreamConfig, collect: list | None = None):
        self.config = config
        self.reports = collect if collect is not None else []
        self.dropped_user_outputs: list[int] = []
        self.n_user_outputs = 0
        self.real_inputs: list = []
        self.graph_id = None
        self.detached: list[int] = []   # traced with these detached (a guess, or ``DetachOutputs``)
        self.warned: set = set()   # refusals warned for this graph (a retrace warns nothing twice)
        self.unstreamed = False    # compile without the passes (after a failure of a streamed compile)
        self.ddp_piece = False     # a piece of a graph that DDPOptimizer cut at gradient buckets
        self.keep_graphs = False   # keep the partitioned graphs (streamed and not) on the analysis
        self.forward_only = False  # an evaluation graph: its forward saves nothing (``without_saved``)
        # an analysis (explain, plan_memory) runs its graphs as FX graphs but reads the graphs the
        # user's codegen compiles: "inductor" passes them through Inductor's graph passes first
        self.passes_of = None
        self.inductor_patches: dict = {}   # (with ``passes_of``: the user's Inductor options, ``StreamConfig.inductor_patches``)
        self.eager_joint = None    # (with ``passes_of``: the joint before those passes, for the baselines)

    def begin_graph(self, gm, example_inputs) -> None:
        self.graph_id = next(_graph_ids)
        # DDPOptimizer marks each piece it compiles with the reason of its intentional graph break
        self.ddp_piece = "DDPOptimizer" in str(getattr(gm, "compile_subgraph_reason", ""))
        out = gm.graph.find_nodes(op="output")[0].args[0]
        self.n_user_outputs = len(out) if isinstance(out, (tuple, list)) else 1
        # parameters and buffers (real tensors) are constants of the graph; every other input is data
        placeholders = gm.graph.find_nodes(op="placeholder")
        self.real_inputs = [x if _is_constant(p) else None for p, x in zip(placeholders, example_inputs)] \
            if len(placeholders) == len(example_inputs) else []

    # -- the partition hook -------------------------------------------------------------------
    def partition(self, joint, joint_inputs, base_partition, **kwargs):
        nfwd = kwargs["num_fwd_outputs"]
        partition_ = base_partition

        def base_partition(joint, joint_inputs, **kwargs):  # the backward exists: gradient stops are aliases
            stops.strip(joint)
            decompose_kept(joint)   # (ops kept whole for the derivative: decomposed for Inductor)
            fw, bw = partition_(joint, joint_inputs, **kwargs)
            return without_saved(fw, bw, nfwd) if self.forward_only else (fw, bw)

        if self.unstreamed:
            return base_partition(joint, joint_inputs, **kwargs)
        original, users = joint, _user_outputs(joint, nfwd, self.n_user_outputs)
        # the baselines (no checkpointing, checkpointing) model eager autograd: the joint as the
        # model wrote it, before any codegen's passes, and every op's saved tensors kept
        baseline = _copy(self.eager_joint if self.eager_joint is not None else joint) if self.keep_graphs else None

        def planned(dropped_fwd):   # outputs the plans drop: traced again without their gradients first
            dropped = sorted(users.get(i, -1) for i in dropped_fwd)
            if -1 in dropped:
                return
            if set(dropped) - set(self.detached):
                raise DetachOutputs(dropped)
            if set(self.detached) - set(dropped):   # (detached on a guess the plans do not bear out)
                raise KeepOutputs(self.detached, planned=dropped)

        try:
            joint, analysis = pipeline.run(joint, nfwd, self.config, self._constants(joint), self._dumper(),
                                           planned=planned)
        except (StreamBPError, DetachOutputs, KeepOutputs, RestartAnalysis):  # (Dynamo's restart: control flow)
            raise
        except Exception as err:  # noqa: BLE001 - a pass bug must not reach the user: run unstreamed
            if verify.enabled():
                raise
            self.refuse("graph", failure(err, "the streaming passes"))
            self._kept_detached()
            return base_partition(joint, joint_inputs, **kwargs)
        if self.ddp_piece:
            analysis.refusals = _ddp_refusals(analysis)
        for regions, err in _grouped(analysis.refusals):
            self.refuse(regions[0], err, also=regions[1:])
        for region, err in analysis.notes:
            self.note(region, err)
        if analysis.programs:
            # the forward's outputs are the mutated inputs, then the user's outputs: a dropped
            # output is returned to the user as None, and Dynamo's graph detaches it (no tangent)
            dropped = sorted(users.get(i, -1) for i in analysis.dropped)
            if -1 in dropped:
                self.refuse("graph", CannotStream("a streamed region drops a forward output that is not "
                                                  "one of the graph's own outputs"))
                self.unstreamed = True
                self._kept_detached()
                return base_partition(original, joint_inputs, **kwargs)
            self.dropped_user_outputs = dropped   # (no more than ``planned`` allowed: the same rule)
        self.reports.append(analysis)   # (its refusals too where the graph then compiles as captured)
        self._kept_detached()
        result = base_partition(joint, joint_inputs, **kwargs)
        if analysis.programs:
            from .membudget import attach

            analysis.graphs = result   # the streamed step's forward and backward (the memory model's)
            analysis.baseline = _eager_partition(baseline, joint_inputs, **kwargs) if baseline is not None else None
            attach(analysis, self.config)
        return result

    def detach(self, indices) -> None:
        """The next compile of this graph is traced with these user outputs detached (none: as
        captured); its plans must drop them (``KeepOutputs``)."""
        self.detached, self.dropped_user_outputs = list(indices), []

    def run_unstreamed(self) -> None:
        """The next compile of this graph is the graph as Dynamo captured it, without the passes
        (nothing detached, nothing dropped)."""
        self.detach(())
        self.unstreamed = True

    def _kept_detached(self) -> None:
        """A graph traced with outputs detached that does not drop them all: the graph as
        Dynamo captured it instead (``KeepOutputs``)."""
        if set(self.detached) - set(self.dropped_user_outputs):
            raise KeepOutputs(self.detached)

    def _dumper(self):
        """Writes each changed graph to ``<dump_dir>/graph<id>.<n>-<step>``; None without a dump dir."""
        directory = self.config.effective_dump_dir
        if not directory:
            return None
        from .dumps import dump_graph, require_graphviz

        require_graphviz()  # asked for dumps: a missing package is the user's error, raised now
        count = itertools.count()

        def dump(step, gm, analysis, programs=()):
            if analysis is None:  # a rewritten graph is dumped with its own analysis
                analysis = pipeline.analyze(gm.graph, len(gm.graph.find_nodes(op="output")[0].args[0]) - len(primals(gm.graph)))
            dump_graph(gm, analysis, directory, f"graph{self.graph_id}.{next(count)}-{step}", programs=programs)

        return dump

    def _constants(self, joint) -> dict:
        """Primal -> real value, for the graph inputs that are parameters or buffers."""
        ps = primals(joint.graph)
        if len(ps) != len(self.real_inputs):
            return {}
        return {p: x for p, x in zip(ps, self.real_inputs)
                if isinstance(x, torch.Tensor) and not isinstance(x, torch._subclasses.FakeTensor)
                and isinstance(p.meta.get("val"), torch.Tensor) and tuple(p.meta["val"].shape) == tuple(x.shape)}

    def refuse(self, region: str, err: CannotStream, also=()) -> None:
        """Warn once per compiled graph and refusal (each new compile that does not fully stream
        warns again; the graph number tells the compiles apart), or raise with ``strict``.
        ``also``: other regions refused for the same cause (the layers of one model), named in the
        same warning."""
        more = ""
        if also:
            names = [f"'{r}'" for r in also]
            listed = ", ".join(names if len(names) <= 4 else names[:3] + ["...", names[-1]])
            more = f" (nor {'is' if len(also) == 1 else f'are the {len(also)} regions'} {listed}, for the same cause)"
        cause = f"streamfx: region '{region}' is not streamed{more}: {err.describe()}"
        if self.config.strict:
            raise StreamBPError(cause + " (strict=True)")
        if cause in self.warned:
            return
        self.warned.add(cause)
        warnings.warn(f"{cause}; it runs without streaming (compiled graph {self.graph_id})", stacklevel=2)

    def note(self, region: str, err: CannotStream) -> None:
        """A region that streams with a caveat: warned once per compiled graph (never an error:
        the region streams)."""
        cause = f"streamfx: region '{region}' streams, but {err.describe()}"
        if cause not in self.warned:
            self.warned.add(cause)
            warnings.warn(f"{cause} (compiled graph {self.graph_id})", stacklevel=2)

    # -- outputs ----------------------------------------------------------------------------
    def wrap(self, compiled):
        dropped = self.dropped_user_outputs
        if not dropped:
            return compiled

        def run(*args):
            outs = compiled(*args)
            seq = list(outs)
            for i in dropped:
                seq[i] = None
            return type(outs)(seq) if isinstance(outs, tuple) else seq

        return run


def without_saved(fw, bw, nfwd: int):
    """A partitioned forward and backward that save nothing: the forward returns only its own
    outputs (what only the backward would have read is no longer computed, or dies once the
    forward is done with it) and the backward takes no saved values and returns no gradients.
    For a graph whose backward never runs (an evaluation graph, called under ``torch.no_grad()``
    only, its outputs detached); AOTAutograd counts what is saved from the forward's outputs."""
    out = fw.graph.find_nodes(op="output")[0]
    saved = len(out.args[0]) - nfwd
    out.args = (tuple(out.args[0][:nfwd]),)
    if isinstance(out.meta.get("desc"), (list, tuple)):
        out.meta["desc"] = list(out.meta["desc"])[:nfwd]
    fw.graph.eliminate_dead_code()
    fw.recompile()
    back = bw.graph.find_nodes(op="output")[0]
    back.args = (tuple(None for _ in back.args[0]),)
    bw.graph.eliminate_dead_code()
    for p in bw.graph.find_nodes(op="placeholder")[:saved]:   # (the saved values come first)
        bw.graph.erase_node(p)
    bw.recompile()
    return fw, bw


def _eager_partition(joint, joint_inputs, **kwargs):
    """The forward and backward of eager autograd: every op's saved tensors kept for the backward
    (AOTAutograd's default partition)."""
    from torch._functorch.partitioners import default_partition

    stops.strip(joint)
    kwargs.pop("compiler", None)
    return default_partition(joint, joint_inputs, **kwargs)


def _copy(gm):
    """A copy of a graph module whose nodes keep their names and metadata."""
    g = torch.fx.Graph()
    g.output(g.graph_copy(gm.graph, {}))
    return torch.fx.GraphModule(gm, g)


def _user_outputs(joint, nfwd: int, n_user: int) -> dict:
    """Forward output index -> index among the user's outputs (Dynamo graph's), from the joint's
    output descriptors; without descriptors, the identity when the counts agree."""
    descs = joint.graph.find_nodes(op="output")[0].meta.get("desc")
    try:
        return {i: d.idx for i, d in enumerate(list(descs)[:nfwd]) if type(d).__name__ == "PlainAOTOutput"}
    except (TypeError, AttributeError):
        return {i: i for i in range(nfwd)} if nfwd == n_user else {}


def _ddp_refusals(a) -> list:
    """The refusals of a DDPOptimizer piece, each naming the cut as its cause. A piece that streams
    nothing though it holds part of a layer (projections or an MLP without their attention, the
    attention without its producers) is refused at its first operation: it runs unstreamed."""
    refusals = [(region, CannotStream(f"{err.reason} ({DDP_CUT})", err.node)) for region, err in a.refusals]
    if not a.plans and not refusals:
        first = next((n for n in a.fwd_nodes if n.op == "call_function" and n.meta.get("stack_trace")), None)
        if first is not None:
            refusals.append(("piece", CannotStream(f"no whole decoder layer or head in this graph ({DDP_CUT})", first)))
    return refusals


def source_name(placeholder) -> str:
    """A Dynamo graph input's source as Dynamo prints it (``L['self']._modules[...]...``), or ""."""
    source = getattr(placeholder.meta.get("grapharg"), "source", None)
    try:
        name = source.name if source is not None else ""
        name = name() if callable(name) else name   # (a method before torch 2.12, a property since)
    except Exception:  # noqa: BLE001 - a source without a printable name
        return ""
    return name if isinstance(name, str) else ""


def _is_constant(placeholder) -> bool:
    """A Dynamo graph input that is a module's parameter or buffer (by its source)."""
    name = source_name(placeholder)
    return "_parameters[" in name or "_buffers[" in name


def _grouped(refusals) -> list:
    """([region names], the first's refusal) per distinct cause, in the order of their first region."""
    groups: dict = {}
    for region, err in refusals:
        groups.setdefault(err.describe(), ([], err))[0].append(region)
    return list(groups.values())
