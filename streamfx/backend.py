"""The ``streambp`` torch.compile backend.

Dynamo graph -> AOTAutograd joint graph -> our partition hook runs the pass pipeline (analyse,
decide, rewrite) and hands the joint to AOTAutograd's partitioner -> codegen: Inductor
(``compile_fx`` with our hook as its custom partitioner) or the FX graphs run as they are.
"""
from __future__ import annotations

import dataclasses
import warnings

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._dynamo.exc import RestartAnalysis
from torch._functorch import config as functorch_config
from torch._functorch.aot_autograd import make_boxed_func
from torch._functorch.partitioners import default_partition
from torch._inductor import config as inductor_config
from torch._inductor.custom_graph_pass import CustomPartitionerFn

from .config import StreamConfig
from .decompose import decompose_kept, decompositions
from . import frames, untraceable
from .errors import CannotStream, StreamBPError, failure
from . import logging_calls
from .passes import inline, stops, unit_axes, units, verify
from .passes.graphs import ancestors
from .session import DetachOutputs, KeepOutputs, Session, _copy as _copy_graph, source_name

logging_calls.install()  # (loaded as a backend: before Dynamo traces the first model)
frames.watch_recompile_limit()


def streambp_backend(gm: torch.fx.GraphModule, example_inputs, options=None, mode=None, **kwargs):
    """Entry point for ``torch.compile(m, backend="streambp", options={...})`` (or ``mode=...``:
    torch.compile takes one of the two; ``streamfx.backend(mode=..., ...)`` takes both)."""
    if kwargs:
        raise StreamBPError(f"unsupported torch.compile argument(s) {sorted(kwargs)} for backend 'streambp'; "
                            f"pass streamfx options through options={{...}} with keys "
                            f"{list(StreamConfig.__dataclass_fields__)}")
    if mode is not None:
        options = {**(options or {}), "mode": mode}
    return compile_graph(gm, example_inputs, StreamConfig.from_options(options))


streambp_backend._streamfx_backend = True


def backend(**fields):
    """A backend callable with fixed options: ``torch.compile(m, backend=streamfx.backend(chunk_size=512))``."""
    config = StreamConfig.from_options(fields)

    def streambp(gm, example_inputs):
        return compile_graph(gm, example_inputs, config)

    streambp.config = config
    streambp._streamfx_backend = True
    return streambp


class _Partitioner(CustomPartitionerFn):
    """Inductor's custom partitioner slot: our pipeline, then Inductor's min-cut partitioner."""

    def __init__(self, session: Session):
        self.session = session

    def __call__(self, gm, joint_inputs, **kwargs):
        from torch._functorch.partitioners import min_cut_rematerialization_partition

        kwargs.pop("compiler", None)
        return self.session.partition(gm, joint_inputs, min_cut_rematerialization_partition,
                                      compiler="inductor", **kwargs)

    def uuid(self):
        return None  # never cached: the rewrite registers runtime programs

    def __deepcopy__(self, memo):  # Inductor copies its config for repro strings
        return self


def compile_graph(gm, example_inputs, config: StreamConfig, session: Session | None = None, detach=None):
    """``gm`` compiled streamed where it streams, exactly as captured where not (warned). ``detach``:
    the user outputs traced detached from the start (None: ``likely_dropped``'s guess)."""
    inline.inline(gm)   # nested compile regions (a layer compiled once for all): their ops in the graph
    reached = differentiable(gm) if session is None and _evaluating(config) else None
    if reached is not None and evaluates_a_loss(gm, reached):
        return _compile_evaluation(gm, example_inputs, config, reached, detach)
    watched = _compiled_without_grad(example_inputs)
    captured = snapshot(gm) if watched else None
    compiled = _compile_graph(gm, example_inputs, config, session, detach)
    return _grad_guard(compiled, captured, watched, config) if watched else compiled


# What an evaluation graph's streamed step changes from the user's options: its head computes
# only its loss per chunk (no gradient in the forward), and nothing is kept for a backward.
EVALUATION = dict(head_grad="recompute", attention="recompute", offload=None, keep_every=1)
_SAID = {"evaluation_logits": False}


def _evaluating(config: StreamConfig) -> bool:
    """Whether a graph compiled now may be an evaluation graph (``evaluates_a_loss``)."""
    return not (torch.is_grad_enabled() or torch.is_inference_mode_enabled() or config.return_logits)


def evaluates_a_loss(gm, reached: set) -> bool:
    """Whether ``gm`` is a graph compiled under ``torch.no_grad()`` (an evaluation: Hugging Face's
    Trainer, a validation loop) that computes a loss from weights that are trained: a scalar
    floating-point output computed from an input that requires a gradient. Such a graph streams
    as its training step's forward does (``_compile_evaluation``): its logits and layer
    intermediates exist one chunk at a time, where an inference graph would hold them for the
    whole sequence. Not with ``return_logits`` (the logits are returned: nothing to stream); a
    graph that serves calls under ``torch.inference_mode()`` finds out at its first call
    (``_compile_evaluation``); those are ``_evaluating``'s conditions. ``reached``: the graph's
    ``differentiable`` nodes."""
    out = gm.graph.find_nodes(op="output")[0].args[0]
    return any(x in reached and _example(x).dim() == 0 for x in (out if isinstance(out, (tuple, list)) else [out])
               if isinstance(x, torch.fx.Node))


def differentiable(gm) -> set:
    """The floating-point tensor nodes of a Dynamo graph computed from an input that requires a
    gradient: those that would need one were the graph run with gradients on."""
    reached = set()
    for n in gm.graph.nodes:
        v = _example(n)
        if v is None or not (v.is_floating_point() or v.is_complex()):
            continue
        if (n.op == "placeholder" and v.requires_grad) or any(x in reached for x in n.all_input_nodes):
            reached.add(n)
    return reached


def _example(n):
    v = n.meta.get("example_value", n.meta.get("val")) if isinstance(n, torch.fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _compile_evaluation(gm, example_inputs, config: StreamConfig, reached: set, detach=None):
    """An evaluation graph (``evaluates_a_loss``) compiled as a training graph is, with gradients
    on while it is traced, and run with them off (Dynamo guards the grad mode: this compile only
    ever serves calls under ``torch.no_grad()``): the forward of its streamed step, which keeps
    nothing for a backward (``Session.forward_only``); its outputs need no gradient, as under
    no_grad. Its loss and every output are those of the graph as captured; outputs the training
    step drops (the logits beside the loss, ``return_logits=False``) are returned as None, as in
    training. A graph that cannot be traced with its backward (an op without a derivative, fine
    under no_grad) compiles for inference as captured, warned."""
    captured, given = snapshot(gm), config
    config = dataclasses.replace(config, **EVALUATION)
    session = Session(config)
    session.forward_only = True
    if detach is None:
        detach = likely_dropped(gm, config, needing_grad=reached)
    try:
        with torch.enable_grad():
            compiled = _compile_graph(gm, example_inputs, config, session, detach)
    except (StreamBPError, RestartAnalysis):
        raise
    except Exception as err:  # noqa: BLE001 - the inference graph Dynamo captured serves the call
        if verify.enabled():
            raise
        session.refuse("evaluation", failure(err, "tracing the evaluation graph with its backward"))
        return _compile_graph(snapshot(captured), example_inputs, given)
    if session.dropped_user_outputs and not _SAID["evaluation_logits"]:
        _SAID["evaluation_logits"] = True
        warnings.warn("streamfx: a call under torch.no_grad() that computes a loss (an evaluation) streams as the "
                      "training step's forward and returns the logits beside its loss as None, as training calls "
                      "do; options={'return_logits': True} returns them (the [B, T, V] logits then exist whole, "
                      "e.g. for a Trainer's compute_metrics) (said once)", stacklevel=2)
    inference = []

    def run(*args):
        if torch.is_inference_mode_enabled():
            # Dynamo compiles with inference mode off, so only a call tells that this graph serves
            # calls under torch.inference_mode(), whose tensors no graph traced with its backward
            # can run on: the graph as captured, compiled for inference (once)
            if not inference:
                with torch.inference_mode(False), torch.no_grad():
                    inference.append(_compile_graph(snapshot(captured), _traced_inputs(captured, args), given))
            return inference[0](*args)
        # (AOTAutograd runs a graph traced with its backward under enable_grad whatever the
        # caller's mode: its outputs are detached, as no_grad's are, and the backward that
        # would read the empty saved tensors is unreachable)
        outs = compiled(*args)
        return type(outs)(x.detach() if isinstance(x, torch.Tensor) else x for x in outs)

    return run


def _compiled_without_grad(example_inputs) -> list:
    """The floating-point tensor inputs a graph is compiled without a gradient for."""
    return [i for i, x in enumerate(example_inputs)
            if isinstance(x, torch.Tensor) and (x.is_floating_point() or x.is_complex()) and not x.requires_grad]


def _grad_guard(compiled, captured, watched: list, config: StreamConfig):
    """``compiled``, or in a call where an input it was compiled without a gradient for needs one,
    the graph as Dynamo captured it compiled again for that call's gradients (streamed as any
    compile, traced with Dynamo's example values: symbolic where the capture is; once per
    pattern of gradients).

    Compiled code returns no gradient for such an input. Dynamo compiles a graph again when an
    input's ``requires_grad`` changes, but torch before 2.13 does not for a module's parameters
    (pytorch/pytorch#139476): a parameter unfrozen after the first step (staged fine-tuning)
    would silently get no gradient."""
    variants = {}

    def run(*args):   # (Dynamo calls a backend's function with the inputs as arguments)
        now = tuple(i for i in watched if args[i].requires_grad) if torch.is_grad_enabled() else ()
        if not now:
            return compiled(*args)
        fn = variants.get(now)
        if fn is None:
            fn = variants[now] = compile_graph(snapshot(captured), _traced_inputs(captured, args), config)
        return fn(*args)

    return run


def _traced_inputs(captured, args) -> list:
    """Inputs to trace the captured graph with for a call's ``args``: Dynamo's own example values
    (fake tensors and symbols of its shape environment: the graph's symbolic sizes and tensors
    made of Python numbers trace as they did when captured), each tensor needing a gradient
    where the call's does."""
    out = []
    for node, a in zip(captured.graph.find_nodes(op="placeholder"), args):
        v = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(v, torch.Tensor) and isinstance(a, torch.Tensor):
            if v.requires_grad != a.requires_grad:
                v = v.detach().requires_grad_(a.requires_grad)
            out.append(v)
        else:
            out.append(v if v is not None else a)
    return out


def _compile_graph(gm, example_inputs, config: StreamConfig, session: Session | None = None,
                   detach=None):
    session = session or Session(config)
    frames.check_callers(config.strict)  # a caller that Dynamo skipped runs eagerly around this graph
    frames.check_break(config.strict)    # a call that Dynamo runs eagerly after this graph, with no graph inside
    stops.mark(gm)
    kept = units.wrap(gm, unit_axes.signature)  # a Function or gradient hook: one op, run per chunk where it is per token
    session.begin_graph(gm, example_inputs)
    refusal = _whole_graph_refusal(gm, kept)
    if refusal is not None:
        session.refuse("graph", refusal)
        session.unstreamed = True
    original = gm
    try:
        first = () if session.unstreamed else likely_dropped(gm, config) if detach is None else tuple(detach)
        if first:
            # (traced with them detached at once: the plans decide, and a wrong guess costs a trace)
            original = snapshot(gm)
            try:
                return _compile_detached(gm, first, example_inputs, config, session)
            except (DetachOutputs, KeepOutputs) as err:  # the plans drop other outputs, or streaming failed
                if err.planned is None:
                    session.run_unstreamed()
                    return _compile(original, example_inputs, config, session)
                session.detach(())
                if err.planned:
                    return _retrace_detached(snapshot(original), err.planned, original, example_inputs, config, session)
                gm = snapshot(original)
        try:
            return _compile(gm, example_inputs, config, session)
        except DetachOutputs as restart:
            # (the plans drop these outputs: traced again with them detached, before the rewrite ran)
            original = snapshot(gm) if original is gm else original
            return _retrace_detached(gm, restart.indices, original, example_inputs, config, session)
    except (StreamBPError, DetachOutputs, KeepOutputs, RestartAnalysis):  # (Dynamo's restart is control flow)
        raise
    except Exception as err:  # noqa: BLE001 - compiling the streamed graph failed: compile it unstreamed
        cause = untraceable.refusal(gm, err)
        if cause is not None:  # no compile can hold this graph: it runs as Dynamo captured it
            session.refuse("graph", cause)
            return original.forward
        if session.unstreamed or session.forward_only or verify.enabled():
            raise   # (an evaluation graph's own fallback is its inference graph: ``_compile_evaluation``)
        session.refuse("graph", failure(err, "compiling the streamed graph"))
        session.run_unstreamed()
        return _compile(original, example_inputs, config, session)


def _whole_graph_refusal(gm, kept: dict) -> CannotStream | None:
    """Why no part of ``gm`` can stream, or None: an op whose backward is not the derivative of its
    forward and that cannot run as one op (``units.wrap`` left it, with why in ``kept``), which the
    streamed joint, differentiating the forward again, would not call."""
    # (a hook that is no unit is never the derivative of its identity forward)
    custom = next((n for n in kept if units.is_hook_call(n)), None) or stops.custom_backward(gm)
    if custom is not None and units.is_hook(custom):
        return CannotStream(
            f"a gradient hook (Tensor.register_hook) that cannot run as one op ({kept.get(custom, 'unknown form')}) "
            "is in the graph (streaming differentiates the forward again and would not apply it); register the "
            "hook outside the compiled code (on the model's output or a parameter) or keep its body to tensor "
            "math, so that the rest streams", custom)
    if custom is not None:
        return CannotStream(
            f"a torch.autograd.Function that cannot run as one op ({kept.get(custom, 'unknown form')}) and whose "
            "backward is not the derivative of its forward is in the graph (streaming differentiates the "
            "forward again and would not call that backward); move the Function out of the compiled code "
            "(torch.compiler.disable on the function that applies it) so that the rest streams", custom)
    leaf = next((n for n in gm.graph.nodes if n.op == "call_function"
                 and getattr(n.target, "__name__", None) == "invoke_leaf_function"), None)
    if leaf is not None:
        return CannotStream(
            "a leaf function (torch._dynamo.decorators.leaf_function) is in the graph: its eager code runs as one "
            "opaque op with side effects, which AOTAutograd orders through effect tokens in the forward and the "
            "backward; streaming differentiates the forward again and would not keep that order; call it from a "
            "torch.compiler.disable'd function instead (a graph break around it), so that the rest streams", leaf)
    subclass = _subclass_input(gm)
    if subclass is not None:
        node, value = subclass
        kind = type(value).__name__
        return CannotStream(
            f"an input of the graph is a tensor subclass ({kind}: {source_name(node) or node.name}"
            + (", a tensor-parallel layer's sharded weight" if kind == "DTensor" else "")
            + "), whose ops AOTAutograd traces through the subclass's own rules, its backward with them (a "
            "DTensor's collectives), which is not the derivative of the forward's ops: streaming differentiates "
            "the forward again and would not run them; shard the parameters with FSDP2 or DeepSpeed ZeRO "
            "instead (their layers compute on plain tensors, which stream)")
    region = next((n for n in gm.graph.nodes if inline.is_region_call(n)), None)
    if region is not None:
        return CannotStream(
            "a call of a nested compile region (torch.compiler.nested_compile_region) that cannot be inlined (its "
            "result is read other than by index) is in the graph: one op whose own backward streaming would not "
            "call; remove the decorator so that the rest streams", region)
    return None


def _subclass_input(gm) -> tuple | None:
    """(placeholder, value) of the first input of Dynamo's graph that is a tensor subclass which
    AOTAutograd desugars (a DTensor), or None."""
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    for node in gm.graph.find_nodes(op="placeholder"):
        value = node.meta.get("example_value", node.meta.get("val"))
        if isinstance(value, torch.Tensor) and is_traceable_wrapper_subclass(value):
            return node, value
    return None


def _compile_detached(gm, indices, example_inputs, config, session):
    session.detach(indices)
    return _compile(detach_outputs(gm, indices), example_inputs, config, session)


def _retrace_detached(gm, indices, original, example_inputs, config, session):
    """``gm`` traced again with the outputs the plans drop detached; where that trace does not
    stream as planned, ``original`` (the graph as captured) unstreamed."""
    try:
        return _compile_detached(gm, indices, example_inputs, config, session)
    except (DetachOutputs, KeepOutputs) as err:
        if err.planned is not None:
            session.refuse("graph", CannotStream(f"traced again with outputs {list(indices)} detached, its plans "
                                                 f"drop {err.planned}"))
        session.run_unstreamed()
        return _compile(original, example_inputs, config, session)


def likely_dropped(gm, config: StreamConfig, needing_grad: set | None = None) -> tuple:
    """The user outputs of a Dynamo graph that its streamed step will likely drop, traced detached
    from the start (the plans decide: a wrong guess costs a trace, never a result). The
    floating-point outputs of one or more dims that need a gradient and that a scalar output
    needing one (the loss) is computed from, the last of each chain: a causal LM's logits beside
    its loss, not the hidden states they are computed from. None with ``return_logits``.
    ``needing_grad``: the nodes that need a gradient, where the graph's example values do not say
    (an evaluation graph, captured without gradients: ``differentiable``)."""
    if config.return_logits:
        return ()
    out = gm.graph.find_nodes(op="output")[0].args[0]
    nodes = list(out) if isinstance(out, (tuple, list)) else [out]

    def needs_grad(x, scalar):
        v = x.meta.get("example_value") if isinstance(x, torch.fx.Node) else None
        grad = (x in needing_grad) if needing_grad is not None else isinstance(v, torch.Tensor) and v.requires_grad
        return isinstance(v, torch.Tensor) and v.is_floating_point() and grad and (v.dim() == 0) == scalar

    losses = [x for x in nodes if needs_grad(x, True)]
    if not losses:
        return ()
    upstream = ancestors(losses)
    wide = {x for x in nodes if needs_grad(x, False) and x in upstream}
    below = set().union(*(ancestors(x.all_input_nodes) for x in wide)) if wide else set()
    return tuple(i for i, x in enumerate(nodes) if x in wide and x not in below)


def snapshot(gm):
    """The Dynamo graph as it is now, before the backend edits it (sharing its attributes)."""
    copy = torch.fx.GraphModule(gm, gm.graph.__deepcopy__({}), class_name=type(gm).__name__)
    copy.meta = dict(gm.meta)
    return copy


def detach_outputs(gm, indices):
    """The Dynamo graph with the given user outputs detached (they are returned as None)."""
    out = gm.graph.find_nodes(op="output")[0]
    values = list(out.args[0])
    with gm.graph.inserting_before(out):
        for i in indices:
            values[i] = gm.graph.call_function(torch.Tensor.detach, (values[i],))
    out.args = (tuple(values),)
    gm.recompile()
    return gm


def _compile(gm, example_inputs, config, session):
    patches = dict(enable_autograd_cache=False)
    # (the user's Inductor options first: streamfx's own settings, inside them, hold)
    passes_of = session is not None and session.passes_of == "inductor"
    user = config.inductor_patches or (session.inductor_patches if passes_of else {})
    with inductor_config.patch(user), functorch_config.patch(**patches), inductor_config.patch(fx_graph_cache=False):
        if config.codegen == "eager" and passes_of:
            compiled = _fx_after_inductor_passes(gm, example_inputs, session)
        elif config.codegen == "eager":
            compiled = aot_autograd(
                fw_compiler=_boxed_nop, bw_compiler=_boxed_nop, inference_compiler=_boxed_nop,
                partition_fn=lambda gm_, ins, **kw: session.partition(gm_, ins, default_partition, **kw),
                decompositions=decompositions(), keep_inference_input_mutations=True,
            )(gm, example_inputs)
        else:
            from torch._inductor.compile_fx import compile_fx

            with inductor_config.patch(custom_partitioner_fn=_Partitioner(session)):
                compiled = compile_fx(gm, example_inputs, inner_compile=_decomposed_inner,
                                      decompositions=decompositions())
    return session.wrap(compiled)


def _decomposed_inner(gm, example_inputs, **kwargs):
    """Inductor's compile of one graph (forward, backward or inference) with the ops kept whole for
    their derivative decomposed first (``decompose.decompose_kept``)."""
    from torch._inductor.compile_fx import compile_fx_inner

    return compile_fx_inner(decompose_kept(gm), example_inputs, **kwargs)


def _fx_after_inductor_passes(gm, example_inputs, session):
    """``gm`` traced as Inductor's compile traces it (its pre-grad passes on the captured graph,
    its joint-graph passes before the partition, its partitioner) and run as FX graphs: what an
    analysis of an Inductor compile reads, without generating code."""
    from torch._dynamo import compiled_autograd
    from torch._dynamo.utils import detect_fake_mode
    from torch._inductor import compile_fx as inductor_compile
    from torch._inductor.virtualized import V
    from torch._subclasses import FakeTensorMode

    # the contexts Inductor's compile runs its passes in (its random-number pass reads V.fake_mode)
    fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
    tracing = torch._guards.TracingContext.try_get() or torch._guards.TracingContext(fake_mode)
    gm = inductor_compile._recursive_pre_grad_passes(gm, example_inputs)

    def partition(joint, joint_inputs, **kwargs):
        if session.keep_graphs:
            session.eager_joint = _copy_graph(joint)
        return inductor_compile.partition_fn(joint, joint_inputs, **kwargs)

    with V.set_fake_mode(fake_mode), torch._guards.tracing(tracing), compiled_autograd._disable(), \
            inductor_config.patch(custom_partitioner_fn=_Partitioner(session)):
        return aot_autograd(
            fw_compiler=_boxed_nop, bw_compiler=_boxed_nop, inference_compiler=_boxed_nop,
            partition_fn=partition, decompositions=decompositions(),
            keep_inference_input_mutations=True,
        )(gm, example_inputs)


def _boxed_nop(gm, example_inputs):
    return make_boxed_func(gm.forward)
