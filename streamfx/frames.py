"""Functions that Dynamo gave up compiling, around the graphs streamfx compiles.

A graph break Dynamo cannot resume from (one inside a loop, such as a loop over decoder layers
whose layers hold a break or are wrapped by FSDP2's or ZeRO-3's parameter hooks; one inside a
call it cannot split) makes Dynamo skip the whole function: it runs eagerly, and only the
functions it calls are compiled, each on its own. What the skipped function computes itself (a
final norm, an LM head and its loss, an attention written inline) then never reaches a backend:
no pass can stream or warn about it. Dynamo records each skipped function in its compilation
metrics; when streamfx compiles a graph that such a function is calling, it names the function,
the graph break and what to change, once per function.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import functools
import inspect
import logging
import os
import re
import sys
import warnings
import weakref

from .errors import StreamBPError

_cursor = None          # the newest compilation-metrics entry already read
_sink = None            # the messages an analysis collects (explain's report), said before or not
_skipped: dict = {}     # (file, first line, name) of a skipped function -> Dynamo's newest record of it
_warned: list = []      # the records warned about (a function skipped again after a reset warns again)


def _read_metrics() -> None:
    """Collects the skipped functions among Dynamo's compilation metrics recorded since the last
    read (Dynamo keeps the newest 64; streamfx reads them at every graph it compiles)."""
    global _cursor
    try:
        from torch._dynamo import utils

        entries = list(utils._compilation_metrics)
    except (ImportError, AttributeError):  # a torch without compilation metrics: nothing to read
        return
    new = entries
    for i in range(len(entries) - 1, -1, -1):
        if entries[i] is _cursor:
            new = entries[i + 1:]
            break
    for m in new:
        if m.fail_type and m.co_filename and m.co_name:
            _skipped[(os.path.abspath(m.co_filename), m.co_firstlineno, m.co_name)] = m
    if entries:
        _cursor = entries[-1]


@functools.cache
def isolated() -> dict:
    """torch.compile's arguments that keep a compile's entries a region of their own (torch >= 2.13's
    ``isolate_recompiles``; {} before). Dynamo keeps one list of compiled entries per function for
    every torch.compile call, and once it holds ``recompile_limit`` entries (8) runs the function
    eagerly without calling any backend: ``nn.Module._call_impl`` and transformers' decorator
    wrappers are one function for every model, so the ninth model compiled in a process (a
    hyperparameter search, a policy beside its reference, an analysis per configuration) would
    not reach its backend. Isolated, each compile counts its own recompiles."""
    import torch

    return {"isolate_recompiles": True} if "isolate_recompiles" in inspect.signature(torch.compile).parameters else {}


@contextlib.contextmanager
def dynamic_records(records=None):
    """Dynamo's automatic-dynamic records (for each compiled function, the sizes and ints its calls
    have seen: one that changed between calls compiles as a symbol) replaced, for the block, by a
    copy of ``records`` (None: none, as in a fresh process); the caller's are back after it.
    Yields the block's records. An analysis's trace then compiles as the model's first compile
    does, whatever the process compiled before, and the sizes it saw do not make the user's own
    next compile symbolic. (Records are written to disk only under ``torch.compiler.config.job_id``:
    kept from the disk for the block.)"""
    import torch

    try:
        from torch._dynamo import pgo
        fresh = pgo.CodeState
        saved = pgo._CODE_STATE, pgo._INIT_CODE_STATE
    except (ImportError, AttributeError):   # (a torch that keeps them otherwise: left as they are)
        yield None
        return
    mine = copy.deepcopy(records) if records is not None else collections.defaultdict(fresh)
    pgo._CODE_STATE, pgo._INIT_CODE_STATE = mine, copy.deepcopy(mine)
    try:
        with torch.compiler.config.patch(job_id=None):
            yield mine
    finally:
        pgo._CODE_STATE, pgo._INIT_CODE_STATE = saved


def traced_call(model, backend, args, kwargs, *, records=None, **compile_kwargs):
    """``torch.compile(model, backend=backend, **compile_kwargs)(*args, **kwargs)``: the one traced
    call of an analysis (``explain``, ``plan_memory``), whose backend is a new object at every
    analysis: ``isolated``, with the accumulated limit lifted for the trace; a torch without
    isolation (before 2.13) lifts both limits for the trace, whose entries then count toward the
    user's own compiles of the same functions. Sizes turn symbolic as in a process whose earlier
    calls are ``records`` (``dynamic_records``; None: the model's first call). Returns the call's
    result and the records after it."""
    import torch
    from torch._dynamo import config

    isolation = isolated()
    lifted = {"accumulated_recompile_limit": max(config.accumulated_recompile_limit, 1 << 20)}
    if not isolation:
        lifted["recompile_limit"] = max(config.recompile_limit, 1 << 20)
    compiled = torch.compile(model, backend=backend, **compile_kwargs, **isolation)
    with config.patch(lifted), dynamic_records(records) as after:
        # (the block's records are its own: the caller's are back after it, and a later block
        # starts from a copy of them)
        return compiled(*args, **kwargs), after


@contextlib.contextmanager
def collected():
    """Yields the list that every message of this module found in the block is added to, once
    each, whether or not it was warned before (a warning is said once per site; an analysis's
    report lists what holds for the call it traced)."""
    global _sink
    saved, _sink = _sink, []
    try:
        yield _sink
    finally:
        _sink = saved


def _found(message: str) -> None:
    if _sink is not None and message not in _sink:
        _sink.append(message)


def check_callers(strict: bool) -> None:
    """Warns (``strict``: raises) once per skipped function that is on the Python stack now,
    i.e. that calls the graph being compiled and runs eagerly around it."""
    _read_metrics()
    if not _skipped:
        return
    try:
        from torch._dynamo.convert_frame import input_codes
    except ImportError:
        return
    frame, breaks = sys._getframe(1), set()
    while frame is not None:  # from the graph being compiled outwards
        code = frame.f_code
        m = _skipped.get((os.path.abspath(code.co_filename), code.co_firstlineno, code.co_name))
        # a function Dynamo tried (since its last reset) that runs its own code, not Dynamo's
        if m is not None and code in input_codes and _model_code(frame):
            where = (m.fail_user_frame_filename, m.fail_user_frame_lineno)
            # a caller skipped for the same break (a decorator's wrapper around a skipped forward)
            # adds nothing: the innermost function that holds it is named
            if where not in breaks:
                message = _describe(code, m)
                _found(message)
                if not any(w is m for w in _warned):
                    if strict:
                        raise StreamBPError(message + " (strict=True)")
                    _warned.append(m)
                    warnings.warn(message, stacklevel=2)
            breaks.add(where)
        frame = frame.f_back


_breaks_said: dict = {}   # (file, line) of a call said to run eagerly -> the break's reason said


def check_break(strict: bool) -> None:
    """Warns (``strict``: raises) once per call site where the graph being compiled ends at a
    graph break inside a call that Dynamo then runs whole and eagerly: a break in a called
    function ends the graph before the call (unless ``torch._dynamo.config.nested_graph_breaks``),
    the call runs uncompiled, and where every function from the call to the break is one that
    Dynamo's rules skip as a frame of its own and one of them is a module's forward
    (``torch.nn``'s modules: ``nn.TransformerEncoder`` and its layers), what they compute, with
    their submodules, never reaches a backend. A break inside an ``autograd.Function``'s forward
    (``_function_call``) or inside the function a higher-order operator runs (``_higher_order_call``:
    ``torch.utils.checkpoint``) is said in any case: Dynamo runs either call whole and eagerly."""
    import torch

    compiling = _compile_locals()
    reason = compiling.get("reason")
    stack = list(getattr(reason, "user_stack", None) or ())
    if not getattr(reason, "graph_break", False) or len(stack) < 2:
        return
    found = _function_call(reason, stack) or _higher_order_call(reason, stack, compiling)
    if found is None:
        if getattr(torch._dynamo.config, "nested_graph_breaks", False):
            return
        found = _module_call(reason, stack)
        if found is None:
            return
    call, message = found
    _found(message)
    if _said_since_reset((call.filename, call.lineno)) and not strict:
        return
    if strict:
        raise StreamBPError(message + " (strict=True)")
    _breaks_said[(call.filename, call.lineno)] = reason
    warnings.warn(message, stacklevel=2)


def _module_call(reason, stack):
    """(the call, what to say) where every function from the call to the break is one Dynamo's
    rules skip and one of them is a module's forward; None otherwise."""
    try:
        from torch._dynamo import trace_rules
        # (a function of the user's own code below the call is compiled as a frame of its own,
        # and its compile says what breaks there)
        if not all(trace_rules.check_file(f.filename, False).skipped for f in stack[1:]):
            return None
    except Exception:  # noqa: BLE001 - a Dynamo without these rules: nothing to tell it by
        return None
    call = stack[0]
    # (a module's forward among them: a break in a hook before the module's own forward, as
    # ZeRO-3's parameter gathering makes, leaves that forward to be compiled on its own)
    skipped = next((f for f in stack[1:] if f.name == "forward"), None)
    if skipped is None:
        return None
    return call, (f"streamfx: Dynamo runs the call at {call.filename}:{call.lineno} (in {call.name}) eagerly: "
                  f"it breaks the graph inside it, at {stack[-1].filename}:{stack[-1].lineno} ({_cause(reason)}), "
                  f"and compiles no function of {skipped.filename} on its own, so what {skipped.name} there "
                  f"computes (its submodules included, up to a function of your own code) runs eagerly and "
                  f"unstreamed. Remove the graph break (TORCH_LOGS=graph_breaks lists them; "
                  f"torch._dynamo.config.nested_graph_breaks = True resumes inside the call instead)"
                  + _warning_hint(str(reason.reason)))


def _function_call(reason, stack):
    """(the ``apply`` call, what to say) where the break is inside the forward of an
    ``autograd.Function``; None otherwise. Dynamo traces a Function whole or not at all, so the
    graph ends before its ``apply`` and the call runs eagerly, its forward under no_grad (what
    Dynamo compiles inside it has no backward) and its own backward outside every graph: nothing
    the Function computes streams, whatever ``nested_graph_breaks`` says."""
    from torch._functorch import autograd_function

    helper = os.path.abspath(inspect.getsourcefile(autograd_function) or "")
    inside = [i for i, f in enumerate(stack) if i and os.path.abspath(f.filename) == helper]
    if not inside:
        return None
    call, at = stack[inside[0] - 1], stack[-1]   # (the apply: in the frame compiled, or one it inlines)
    return call, (f"streamfx: Dynamo runs the autograd.Function call at {call.filename}:{call.lineno} "
                  f"({(call.line or call.name).strip()}) eagerly: its forward breaks the graph at "
                  f"{at.filename}:{at.lineno} ({_cause(reason)}), and Dynamo compiles a Function whole or not "
                  f"at all, so what the Function computes, in its forward and its own backward (the layers it "
                  f"runs included), runs eagerly and unstreamed. Remove the graph break from the Function's "
                  f"forward (TORCH_LOGS=graph_breaks lists them); a Function Dynamo traces streams as a unit "
                  f"with its own backward")


def _higher_order_call(reason, stack, compiling: dict):
    """(the call, what to say) where the graph ends before a call of a higher-order operator
    (``torch.utils.checkpoint.checkpoint``; those without an eager fallback, such as ``torch.cond``,
    raise instead) whose function breaks the graph; None otherwise. Dynamo traces such a call
    whole or not at all, also under ``nested_graph_breaks``: the call runs eagerly, and the
    function it runs never reaches streamfx's backend (checkpoint runs it with Dynamo off), so
    nothing it computes streams. Told by the operator among the call's values on Dynamo's stack
    where the graph ends (``compiling``: ``_compile_locals()``); where the graph before the call is
    empty no backend is called, and nothing is said."""
    try:
        from torch._dynamo.variables.higher_order_ops import (CheckpointHigherOrderVariable,
                                                              TorchHigherOrderOperatorVariable)
        from torch._dynamo.variables.lazy import LazyVariableTracker
    except ImportError:   # (a Dynamo without them: nothing to tell the call by)
        return None
    tx, pops = compiling.get("tx"), compiling.get("stack_pops")
    values = list(getattr(tx, "stack", None) or ())
    if not isinstance(pops, int) or pops <= 0 or len(values) < pops:
        return None
    operator = None
    for value in values[-pops:]:   # (the call's callee and arguments, in the interpreter's order)
        if isinstance(value, LazyVariableTracker):
            if not value.is_realized():   # (one Dynamo never looked into: not the callee it traced)
                continue
            value = value.unwrap()
        if isinstance(value, TorchHigherOrderOperatorVariable):
            operator = value
            break
    if operator is None:
        return None
    hop = getattr(operator, "value", None)
    name = hop.name() if callable(getattr(hop, "name", None)) else type(operator).__name__
    call, at = stack[0], stack[-1]
    checkpointed = isinstance(operator, CheckpointHigherOrderVariable)
    return call, (f"streamfx: Dynamo runs the call at {call.filename}:{call.lineno} "
                  f"({(call.line or call.name).strip()}) eagerly: it is a higher-order operator ({name}), which "
                  f"Dynamo traces whole or not at all, and the function it runs breaks the graph at "
                  f"{at.filename}:{at.lineno} ({_cause(reason)}), so that function never reaches the streambp "
                  f"backend"
                  + (" (torch.utils.checkpoint runs it with Dynamo off)" if checkpointed else "")
                  + ": what it computes (the layers it runs included) runs eagerly and unstreamed. Remove the "
                  f"graph break (TORCH_LOGS=graph_breaks lists them)"
                  + ("; or call the layer without torch.utils.checkpoint: streambp recomputes each layer per "
                     "chunk itself, so checkpointing adds nothing to it, and a break in the layer's own frame "
                     "then only splits its graph" if checkpointed else "")
                  + _data_dependent_hint(str(reason.reason)))


def _cause(reason) -> str:
    """Dynamo's reason for a break: its first line, and its explanation where it gives one."""
    lines = [ln.strip() for ln in str(reason.reason).splitlines() if ln.strip()]
    detail = next((ln for ln in lines[1:] if ln.startswith("Explanation")), "")
    return (lines[0] if lines else "a graph break") + (f"; {detail}" if detail else "")


def _warning_hint(reason: str) -> str:
    """A break at ``warnings.warn``: the warning says what to change."""
    if "warnings.warn" not in reason:
        return ""
    return (". This break is a warnings.warn call, which Dynamo does not trace: the warning, shown when "
            "the model runs, says what to change (nn.TransformerEncoder warns when its mask and "
            "src_key_padding_mask differ in type: give both as booleans, True where a key is hidden)")


def _said_since_reset(site) -> bool:
    """Whether the break at ``site`` was said since Dynamo's last reset (which clears its list of
    graph break reasons: a model compiled again after it is told again)."""
    from torch._dynamo.utils import graph_break_reasons

    said = _breaks_said.get(site)
    return said is not None and any(r is said for r in graph_break_reasons)


def _compile_locals() -> dict:
    """The locals of Dynamo's ``compile_subgraph`` compiling the graph being compiled now (its
    ``reason``, a ``GraphCompileReason``: a graph break, with the user's stack where it happened;
    ``tx``, the interpreter whose ``stack`` holds the values where the graph ends, and
    ``stack_pops``, how many of them the instruction there takes), {} where it is not on the stack."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_name == "compile_subgraph" and "reason" in frame.f_locals:
            return frame.f_locals
        frame = frame.f_back
    return {}


def _model_code(frame) -> bool:
    """A method of the module it runs on (through decorators' ``functools.wraps``), or a function
    outside the installed packages (the user's own code). Not a decorator's wrapper or an
    engine's helper: those compute nothing of the model themselves."""
    import torch

    code, owner = frame.f_code, frame.f_locals.get("self")
    if isinstance(owner, torch.nn.Module):
        name = code.co_name
        _, resumed, tail = name.partition("torch_dynamo_resume_in_")
        if resumed:  # Dynamo's function for the rest of a method after an earlier graph break
            return callable(getattr(type(owner), tail.rpartition("_at_")[0], None))
        fn = getattr(type(owner), name, None)
        for _ in range(8):  # the method, then what each decorator wraps
            if fn is None:
                break
            if getattr(fn, "__code__", None) is code:
                return True
            fn = getattr(fn, "__wrapped__", None)
    path = os.path.abspath(code.co_filename)
    return not any(part in ("site-packages", "dist-packages") for part in path.split(os.sep))


def _describe(code, m) -> str:
    name, file, line = getattr(code, "co_qualname", code.co_name), code.co_filename, code.co_firstlineno
    head, sep, tail = name.rpartition("torch_dynamo_resume_in_")
    if sep:  # Dynamo's function for the rest of a function after an earlier graph break
        function, _, after = tail.rpartition("_at_")
        name = f"the rest of {head}{function} after line {after}"
    reason = (m.fail_reason or m.fail_type).strip().splitlines()[0].strip()
    at = f" at {m.fail_user_frame_filename}:{m.fail_user_frame_lineno}" if m.fail_user_frame_filename else ""
    return (f"streamfx: Dynamo runs {name} ({file}:{line}) without compiling it, after a graph break it "
            f"cannot resume from ({reason}{at}; a break inside a loop, such as a loop over layers whose "
            f"layers hold a break or FSDP2's or ZeRO-3's parameter hooks, skips the whole function): what "
            f"that function computes itself (an LM head and its loss, an attention written there) runs "
            f"eagerly and unstreamed, and only the functions it calls are compiled and streamed. Remove the "
            f"graph break (TORCH_LOGS=graph_breaks lists them), or compile the parts that should stream "
            f"on their own (each decoder layer with layer.compile(backend='streambp'); the head and its "
            f"loss as a function of the hidden states)" + _data_dependent_hint(reason)
            + _checkpoint_hint(m.fail_reason or ""))


def _checkpoint_hint(reason: str) -> str:
    """Dynamo's activation-checkpoint operator refuses a side effect in the checkpointed forward
    (transformers >= 5.25's layers set and reset the `kernels` package's routing variable in
    theirs), so a model with Hugging Face's gradient checkpointing on breaks at every layer."""
    if not re.search(r"torch\.utils\.checkpoint|activation checkpointing", reason, re.I):
        return ""
    return (". This break is activation checkpointing's (torch.utils.checkpoint, as Hugging Face's "
            "gradient_checkpointing_enable() / activation_checkpointing_enable() or a trainer's "
            "gradient_checkpointing=True turn on): streambp recomputes each layer per chunk itself, so "
            "checkpointing adds nothing to it; turn it off (model.gradient_checkpointing_disable(), "
            "streamfx.prepare(model)), or set torch._dynamo.config."
            "skip_fwd_side_effects_in_bwd_under_checkpoint = True before the first call, which lets "
            "Dynamo trace the checkpointed layers whole")


def _data_dependent_hint(reason: str) -> str:
    """Dynamo breaks at a value read from a tensor (``.tolist()`` of tokens-per-expert counts,
    ``.item()``) unless told to trace it as a symbol."""
    if not re.search(r"data.dependent|\.item\(|tolist|_local_scalar_dense|dynamic output shape", reason, re.I):
        return ""
    return (". This break reads a value out of a tensor (.tolist(), .item(), nonzero): Dynamo traces it as a "
            "symbol with torch._dynamo.config.capture_scalar_outputs = True (and "
            "capture_dynamic_output_shape_ops = True for ops whose output size depends on the data), set "
            "before the first call")


# ---- Dynamo's recompile limit ---------------------------------------------------------------------
# torch.compile's backend object -> (file, first line, name) of the functions whose limit was said
# (each torch.compile call says it for itself)
_limit_warned = weakref.WeakKeyDictionary()
_limit_said: set = set()


class _RecompileLimit(logging.Filter):
    """Dynamo logs (``torch._dynamo.convert_frame``, at WARNING) when a function holds
    ``recompile_limit`` compiled entries (8) and a call fits none of them; from then on such calls
    run eagerly without calling any backend. Where that function's compiles are streamfx's, those
    steps keep the whole sequence's activations and logits: said once per function (``strict``:
    raised). Dynamo's own record is let through."""

    def filter(self, record) -> bool:
        if str(record.msg).startswith("torch._dynamo hit config."):
            _recompile_limit_hit(record)
        return True


def _recompile_limit_hit(record) -> None:
    frame = sys._getframe(2)
    while frame is not None and not (frame.f_code.co_name == "_compile" and "compiler_fn" in frame.f_locals):
        frame = frame.f_back
    if frame is None:   # (a Dynamo that logs it elsewhere: nothing to tell the backend by)
        return
    compiler_fn = frame.f_locals["compiler_fn"]
    config = _streamfx_config(compiler_fn)
    code = frame.f_locals.get("code")
    if config is None or code is None:
        return
    key = (os.path.abspath(code.co_filename), code.co_firstlineno, code.co_name)
    try:
        said = _limit_warned.setdefault(compiler_fn, set())
    except TypeError:   # (a backend object without weak references: said once per process)
        said = _limit_said
    if key in said:
        return
    args = record.args if isinstance(record.args, tuple) and len(record.args) >= 4 else None
    # (the module whose method it is; a decorator's wrapper holds it first in its args)
    user = frame.f_locals.get("locals") or {}
    owner = user.get("self", next(iter(user.get("args", None) or ()), None)) if isinstance(user, dict) else None
    of = f"{type(owner).__name__}'s " if owner is not None and hasattr(owner, "_call_impl") else ""
    limit = f"torch._dynamo.config.{args[0]} ({args[1]})" if args else "torch._dynamo.config.recompile_limit"
    reason = f"; the last recompile's reason: {args[3]}" if args and args[3] else ""
    message = (f"streamfx: Dynamo holds {limit} compiled graphs of {of}{code.co_name} ({code.co_filename}:"
               f"{code.co_firstlineno}) and runs a call that fits none of them eagerly, without the streambp "
               f"backend{reason}: that call and every later one like it does not stream (it keeps the whole "
               f"sequence's activations and logits). Sizes that change from call to call compile once as "
               f"symbols under dynamic=None (torch.compile's default) or dynamic=True, not dynamic=False; or "
               f"raise torch._dynamo.config.{args[0] if args else 'recompile_limit'}")
    if config.strict:
        raise StreamBPError(message + " (strict=True)")
    said.add(key)
    warnings.warn(message, stacklevel=2)


def _streamfx_config(compiler_fn):
    """The StreamConfig of a Dynamo backend that is streamfx's (``backend="streambp"`` with its
    options or mode, ``streamfx.backend(...)``), else None."""
    try:
        from torch._dynamo.eval_frame import innermost_backend

        wrapper = innermost_backend(compiler_fn)
    except Exception:  # noqa: BLE001 - a Dynamo without it: nothing to tell the backend by
        return None
    fn = getattr(wrapper, "compiler_fn", wrapper)
    if not getattr(fn, "_streamfx_backend", False):
        return None
    from .config import StreamConfig

    config = getattr(fn, "config", None)
    if config is not None:
        return config
    kwargs = dict(getattr(wrapper, "kwargs", None) or {})
    try:
        options = dict(kwargs.get("options") or {})
        if kwargs.get("mode") is not None:
            options["mode"] = kwargs["mode"]
        return StreamConfig.from_options(options)
    except Exception:  # noqa: BLE001 - options its compiles refused: said there
        return StreamConfig()


def watch_recompile_limit() -> None:
    """Installs the filter once (when streamfx is loaded as a backend)."""
    log = logging.getLogger("torch._dynamo.convert_frame")
    if not any(isinstance(f, _RecompileLimit) for f in log.filters):
        log.addFilter(_RecompileLimit())
