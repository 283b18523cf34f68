"""streambp in the trainers people run: Hugging Face Trainer, accelerate, TRL (SFT, DPO, GRPO), PEFT.

One line per trainer::

    Trainer(..., callbacks=[streamfx.StreamBPCallback()])       # HF Trainer and TRL's SFT/DPO/GRPO trainers
    model = streamfx.prepare(model)                              # accelerate, or a loop of your own

Both compile the model in place (``nn.Module.compile``), so ``model.forward`` keeps its signature
(the Trainer's column filtering reads it) and a trainer that replaces ``forward`` (TRL's fused LM
head) is still compiled. What ``prepare`` does to the model, and why:

- TRL's fused LM head (``trl.trainer.utils.add_fused_lm_head``, a vocabulary-tiled kernel written
  with ``torch.mm(..., out=tile)``) breaks the Dynamo graph, so the loss would leave the compiled
  code and the head would not stream. It is replaced, on the model it was installed on, by the
  same computation in plain PyTorch (log-softmax, the label's log-probability, entropy, top-1,
  the loss), which the streamed head runs chunk by chunk. The outputs, their masking and the
  loss are TRL's; the values agree with TRL's kernel to fp32 rounding. Per-token outputs
  (``[B, T - 1]``, no vocabulary dim) are returned, so the model is compiled with
  ``return_logits=True``: it keeps per-token head outputs (the adapter never returns logits).
- Forward calls under ``torch.no_grad()`` through that head (GRPO's old-policy log-probs,
  evaluation, DPO's and GRPO's reference log-probs) run a streamed training graph with gradients
  switched on at the call and their outputs detached: nothing is differentiated and no
  ``[B, T, V]`` logits exist (an inference graph does not stream). With trainable weights the
  training step's own graph serves them; with none (a PEFT reference: the adapter switched off)
  the input embedding is made differentiable for the call, which compiles one more graph, once.
- Gradient checkpointing is switched off (once, with a note) the first time the model is called:
  a streamed layer already keeps only its input, which is what checkpointing keeps, and
  recomputes chunk by chunk, so checkpointing adds nothing; where Dynamo cannot trace the
  checkpointed forward (transformers' ``kernels`` routing variable, set in every layer's forward)
  each layer would break the graph and not stream.
  If a trainer switches it on again, it is switched off again before the next call, so toggling
  it (DPO's reference forward, GRPO's generation) changes nothing the compiled graph guards on.
- ``generate`` (GRPO's rollouts, evaluation callbacks) and any call with a KV cache run the
  uncompiled module: decoding lengths never reach the compiled graph or its recompile budget.

``torch_compile_backend="streambp"`` cannot work through accelerate (its ``DynamoBackend`` is a
fixed list, and a ``torch.compile`` wrapper hides ``forward``'s signature from the Trainer and is
bypassed by TRL); once ``streamfx`` is imported, accelerate's error names the line above.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import threading
import types
import warnings

import torch

from .config import StreamConfig
from .errors import StreamBPError

CALLBACK_LINE = "callbacks=[streamfx.StreamBPCallback()]"
PREPARE_LINE = "model = streamfx.prepare(model)"
_TRL_FUSED_VARS = ("original_forward", "temperature", "cast_lm_head_to_fp32", "outputs",
                   "final_logit_softcapping", "logit_scale", "backbone_attr")


@dataclasses.dataclass
class StreamState:
    """What ``prepare`` installed on a model, and what happened since (read by tests and examples)."""
    options: dict
    dynamic: bool | None
    target: torch.nn.Module = dataclasses.field(repr=False)
    compiles: int = 0                       # backend compilations of this model (graphs handed to streambp)
    graphs: list = dataclasses.field(default_factory=list)  # per compile: input shapes as Dynamo gave them
    regions: list = dataclasses.field(default_factory=list)  # per compile: (name, chunk size) of the streamed regions
    compiled_calls: int = 0                 # calls that went through the compiled graph
    eager_calls: int = 0                    # calls routed to the uncompiled module (generation, KV cache)
    no_grad_calls: int = 0                  # fused-head calls under no_grad served by the training graph
    frozen_calls: int = 0                   # no_grad fused-head calls with nothing trainable (a reference)
    trl_kernel_calls: int = 0               # the same without an input embedding: TRL's kernel, uncompiled
    trl_head: bool = False                  # TRL's fused head was replaced by the streamable one
    compiled: object = dataclasses.field(default=None, repr=False)  # torch.compile of target._call_impl
    trl_forward: object = dataclasses.field(default=None, repr=False)  # TRL's fused forward (function)
    checkpointing_disabled: int = 0         # times gradient checkpointing was found on and switched off
    never_compiled_warned: bool = False     # a training call reached no backend, and that was said
    _local: threading.local = dataclasses.field(default_factory=threading.local, repr=False)

    @property
    def generating(self) -> bool:
        return getattr(self._local, "generating", 0) > 0


# ---- prepare ------------------------------------------------------------------------------------
def prepare(model: torch.nn.Module, *, dynamic: bool | None = None, **options) -> torch.nn.Module:
    """Compile ``model`` in place with the streambp backend for training under a trainer or a loop of
    your own; returns the same object (``model.forward`` and its signature unchanged).

    ``options`` are the backend's (``streamfx.StreamConfig``: chunk_size, head_chunk_size, codegen,
    ...); ``dynamic`` is ``torch.compile``'s. A PEFT model is compiled at its base causal LM (LoRA
    layers included). Calling ``prepare`` again with the same settings does nothing."""
    if isinstance(model, torch._dynamo.eval_frame.OptimizedModule):
        raise StreamBPError(
            "streamfx.prepare got a torch.compile wrapper (OptimizedModule): trainers read forward's signature "
            "and TRL replaces forward, which bypasses the wrapper. Pass the model itself: "
            f"{PREPARE_LINE} compiles it in place")
    StreamConfig.from_options(options)  # validate before touching the model
    target = _compile_target(model)
    state = getattr(target, "_streamfx_state", None)
    if state is not None:
        if state.options != options or state.dynamic != dynamic:
            raise StreamBPError(f"the model was already prepared with options {state.options}, "
                                f"dynamic={state.dynamic}; prepare it once (got options {options}, dynamic={dynamic})")
        return model
    state = StreamState(dict(options), dynamic, target)
    target._streamfx_state = state
    _adapt_trl_head(target, state)
    _install(target, state)
    return model


def state_of(model: torch.nn.Module) -> StreamState | None:
    """The ``StreamState`` of a prepared model (or of the model a PEFT wrapper holds), else None."""
    try:
        return getattr(_compile_target(model), "_streamfx_state", None)
    except StreamBPError:
        return None


def _compile_target(model: torch.nn.Module) -> torch.nn.Module:
    """The module to compile: the model, or the causal LM inside a PEFT / DDP wrapper."""
    m = model
    for _ in range(8):
        if isinstance(m, torch._dynamo.eval_frame.OptimizedModule):
            raise StreamBPError(
                "the trainer holds a torch.compile wrapper (OptimizedModule) of the model: its forward signature "
                "is (*args, **kwargs) and TRL replaces forward on it, so nothing would stream. Hand the trainer the "
                f"model itself and add {CALLBACK_LINE}")
        if isinstance(m, (torch.nn.parallel.DistributedDataParallel, torch.nn.DataParallel)):
            m = m.module
            continue
        if type(m).__name__.startswith("Peft") and hasattr(m, "get_base_model"):
            m = m.get_base_model()
            continue
        return m
    return m


def _install(target: torch.nn.Module, state: StreamState) -> None:
    from . import frames
    from .backend import compile_graph

    config = StreamConfig.from_options(_effective_options(state))

    def backend(gm, example_inputs):
        from .runtime import _PROGRAMS

        state.compiles += 1
        state.graphs.append([tuple(x.shape) if isinstance(x, torch.Tensor) else x for x in example_inputs])
        before = set(_PROGRAMS)
        compiled = compile_graph(gm, example_inputs, config)
        new = [(p.name, p.chunk_size) for k, p in _PROGRAMS.items() if k not in before]
        state.regions.append(list(dict.fromkeys(new)))  # (a retrace after dropping logits registers them again)
        return compiled

    backend.config, backend._streamfx_backend = config, True
    # (a region of its own: every model prepared in the process counts its own recompiles)
    state.compiled = torch.compile(target._call_impl, backend=backend, dynamic=state.dynamic, **frames.isolated())
    if getattr(getattr(target, "_compiled_call_impl", None), "_streamfx", False):
        return  # the dispatcher is installed; it reads state.compiled
    gc_modules = [m for m in target.modules() if hasattr(m, "gradient_checkpointing")]
    try:
        takes_use_cache = "use_cache" in inspect.signature(type(target).forward).parameters
    except (TypeError, ValueError):
        takes_use_cache = False

    def call(*args, **kwargs):
        if state.generating or kwargs.get("past_key_values") is not None or kwargs.get("use_cache") is True:
            state.eager_calls += 1
            return target._call_impl(*args, **kwargs)
        if _require_grads_hooks(target) or any(getattr(m, "gradient_checkpointing", False) for m in gc_modules):
            _checkpointing_off(target, gc_modules, state)
        if _trl_fused_vars(target.forward) is not None:  # TRL installed its head after prepare()
            _adapt_trl_head(target, state)
        if takes_use_cache and "use_cache" not in kwargs and (torch.is_grad_enabled() or kwargs.get("labels") is not None) \
                and getattr(getattr(target, "config", None), "use_cache", False):
            # a training forward, or an evaluation's (a loss under no_grad, as Trainer.evaluate
            # calls it: it ignores past_key_values), needs no KV cache (config.use_cache is for generate)
            kwargs["use_cache"] = False
        if state.trl_head and kwargs.get("fused_lm_head") and not torch.is_grad_enabled():
            if any(p.requires_grad for p in target.parameters()):
                state.no_grad_calls += 1
                state.compiled_calls += 1
                with torch.enable_grad():
                    return _detached(state.compiled(*args, **kwargs))
            # Nothing trainable (a PEFT reference with the adapter switched off, a frozen reference
            # model): an inference graph would not stream and would hold [B, T, V] logits. The input
            # embedding is made differentiable for the call, so the streamed training graph serves it
            # (compiled once, beside the policy's); nothing is differentiated, the flag is restored.
            emb = _input_embedding_weight(target)
            if emb is not None:
                state.frozen_calls += 1
                state.compiled_calls += 1
                emb.requires_grad_(True)
                try:
                    with torch.enable_grad():
                        return _detached(state.compiled(*args, **kwargs))
                finally:
                    emb.requires_grad_(False)
            state.trl_kernel_calls += 1  # no embedding to differentiate: TRL's kernel, uncompiled
            streamable, target.forward = target.forward, types.MethodType(state.trl_forward, target)
            try:
                return target._call_impl(*args, **kwargs)
            finally:
                target.forward = streamable
        state.compiled_calls += 1
        out = state.compiled(*args, **kwargs)
        if not state.compiles and torch.is_grad_enabled():
            _never_compiled(target, state, config.strict)
        return out

    call._streamfx = True
    target._compiled_call_impl = call
    _wrap_generate(target, state)


def _never_compiled(target, state: StreamState, strict: bool) -> None:
    """A training call of a prepared model that reached no backend: Dynamo ran it eagerly. Warned
    once per model (``strict``: raised)."""
    from torch._dynamo import config

    if state.never_compiled_warned:
        return
    message = (f"streamfx: torch.compile ran {type(target).__name__} without handing its graph to the streambp "
               f"backend: nothing streams, the step runs eagerly. Dynamo runs a function without compiling it once "
               f"it holds torch._dynamo.config.recompile_limit ({config.recompile_limit}) compiled entries, and "
               f"before torch 2.13 (no isolate_recompiles) every torch.compile call in the process counts toward "
               f"it (nn.Module._call_impl is one function for every model: each model prepared earlier took an "
               f"entry); compiling is also off under TORCHDYNAMO_DISABLE=1 or torch.compiler.set_stance"
               f"('force_eager'). Raise torch._dynamo.config.recompile_limit, or prepare fewer models in one process")
    if strict:
        raise StreamBPError(message + " (strict=True)")
    state.never_compiled_warned = True
    warnings.warn(message, stacklevel=3)


def _input_embedding_weight(target):
    try:
        w = target.get_input_embeddings().weight
    except (AttributeError, NotImplementedError):
        return None
    return w if isinstance(w, torch.nn.Parameter) and w.is_leaf and w.is_floating_point() else None


def _effective_options(state: StreamState) -> dict:
    options = dict(state.options)
    if state.trl_head:
        options.setdefault("return_logits", True)
    return options


def _detached(out):
    if isinstance(out, torch.Tensor):
        return out.detach()
    if isinstance(out, dict):  # ModelOutput
        for k, v in list(out.items()):
            if isinstance(v, torch.Tensor):
                out[k] = v.detach()
        return out
    if isinstance(out, (tuple, list)):
        return type(out)(_detached(x) for x in out)
    return out


_noted: set = set()


def _checkpointing_off(target, gc_modules, state) -> None:
    """Checkpointing flags off; the hooks that make the embedding output require grad for it
    (``enable_input_require_grads``, installed with PEFT + checkpointing) removed: a
    ``requires_grad_()`` inside the compiled graph breaks it before the layers."""
    for m in gc_modules:
        m.gradient_checkpointing = False
    # every enable_input_require_grads() call adds a hook and forgets the earlier ones
    # (disable_input_require_grads removes only the last): remove them all from the module
    for emb, key in _require_grads_hooks(target):
        for hooks in (emb._forward_hooks, emb._forward_hooks_with_kwargs, emb._forward_hooks_always_called):
            hooks.pop(key, None)
    if getattr(target, "_require_grads_hooks", None):
        target._require_grads_hooks = []
    state.checkpointing_disabled += 1
    key = id(target)
    if key not in _noted:
        _noted.add(key)
        warnings.warn(
            f"streamfx: gradient checkpointing is switched off for {type(target).__name__}: streambp keeps only each "
            "layer's input, as checkpointing does, and recomputes chunk by chunk, so checkpointing adds nothing, and a "
            "checkpointed layer Dynamo cannot trace breaks the graph and does not stream (gradient_checkpointing=True "
            "in the trainer's arguments is ignored, "
            "and the embedding hook it needs with PEFT, enable_input_require_grads, is removed)",
            stacklevel=3)


_REQUIRE_GRADS_HOOKS = ("make_inputs_require_grads", "make_inputs_require_grad")  # transformers, PEFT


def _require_grads_hooks(target) -> list:
    """(module, hook id) of the forward hooks that call ``output.requires_grad_(True)`` on the input
    embeddings (transformers' and PEFT's ``enable_input_require_grads``)."""
    try:
        emb = target.get_input_embeddings()
    except (AttributeError, NotImplementedError):
        return []
    hooks = getattr(emb, "_forward_hooks", None) or {}
    return [(emb, k) for k, fn in hooks.items() if getattr(fn, "__name__", "") in _REQUIRE_GRADS_HOOKS]


def _wrap_generate(target, state) -> None:
    generate = getattr(target, "generate", None)
    if generate is None or getattr(generate, "_streamfx", False):
        return

    @functools.wraps(generate)
    def uncompiled_generate(*args, **kwargs):
        state._local.generating = getattr(state._local, "generating", 0) + 1
        try:
            return generate(*args, **kwargs)
        finally:
            state._local.generating -= 1

    uncompiled_generate._streamfx = True
    target.generate = uncompiled_generate


# ---- TRL's fused LM head -------------------------------------------------------------------------
def _is_trl_fused(func) -> bool:
    code = getattr(func, "__code__", None)  # (functools.wraps gave it the model's forward's name)
    return code is not None and code.co_name == "_fused_forward" and "add_fused_lm_head" in code.co_qualname


def _fused_chain(forward) -> tuple:
    """(wrappers, TRL's fused forward function) of a model's ``forward``, or (None, None).

    TRL installs its fused forward on the model; under mixed precision Accelerate then wraps
    the model's forward in an autocast decorator and an fp32 conversion of the outputs.
    ``wrappers``: from the outermost, each a function of the wrapped function that rebuilds it
    (so the streamable forward is wrapped the same way)."""
    from torch.amp.autocast_mode import autocast_decorator

    func = getattr(forward, "__func__", forward)
    wrappers = []
    for _ in range(8):
        if _is_trl_fused(func):
            return wrappers, func
        inner = getattr(func, "__wrapped__", None)
        if inner is None:
            return None, None
        cells = dict(zip(getattr(func, "__code__", None) and func.__code__.co_freevars or (),
                         getattr(func, "__closure__", None) or ()))
        if type(inner).__name__ == "ConvertOutputsToFp32":  # Accelerate's convert_outputs_to_fp32
            from accelerate.utils import convert_outputs_to_fp32

            wrappers.append(convert_outputs_to_fp32)
            func = inner.model_forward
        elif func.__name__ == inner.__name__ and "autocast_instance" in cells:  # torch.autocast as a decorator
            instance = cells["autocast_instance"].cell_contents
            wrappers.append(lambda f, instance=instance: autocast_decorator(instance, f))
            func = inner
        else:
            return None, None  # a wrapper streamfx does not know: TRL's head stays as it is
    return None, None


def _trl_fused_vars(forward) -> dict | None:
    """The settings TRL's ``add_fused_lm_head`` closed over, if ``forward`` is its fused forward
    (possibly inside Accelerate's mixed-precision wrappers)."""
    _, func = _fused_chain(forward)
    if func is None:
        return None
    cells = dict(zip(func.__code__.co_freevars, func.__closure__ or ()))
    missing = [k for k in _TRL_FUSED_VARS if k not in cells]
    if missing:
        warnings.warn(f"streamfx: TRL's fused LM head of this TRL version is not recognised (no {missing}); the head "
                      "runs TRL's kernel outside the compiled graph and does not stream")
        return None
    return {k: cells[k].cell_contents for k in _TRL_FUSED_VARS}


def _adapt_trl_head(target, state) -> None:
    settings = _trl_fused_vars(target.forward)
    if settings is None:
        return
    wrappers, fused = _fused_chain(target.forward)
    state.trl_forward = target.forward.__func__  # (with its wrappers: what the kernel fallback calls)
    streamable = _streamable_fused_forward(settings, fused)
    for wrap in reversed(wrappers):
        streamable = wrap(streamable)
    target.forward = types.MethodType(streamable, target)
    if not state.trl_head:
        state.trl_head = True
        if state.compiled is not None:
            _install(target, state)  # compile again with the head's options (per-token outputs kept)


def _streamable_fused_forward(s: dict, trl_function):
    """TRL's fused forward (``add_fused_lm_head``) written with plain PyTorch ops: the streamed head
    computes it chunk by chunk. Same arguments, same outputs and masking, same loss."""
    original_forward = s["original_forward"]
    temperature, cast_fp32, outputs = s["temperature"], s["cast_lm_head_to_fp32"], tuple(s["outputs"])
    softcap, logit_scale, backbone_attr = s["final_logit_softcapping"], s["logit_scale"], s["backbone_attr"]
    output_cls = _output_class()  # (made here: Dynamo does not trace class definitions)

    def _fused_forward(self, *args, fused_lm_head=False, labels=None, shift_labels=None, num_items_in_batch=None,
                       **kwargs):
        if not fused_lm_head:
            if labels is not None:
                kwargs["labels"] = labels
            if shift_labels is not None:
                kwargs["shift_labels"] = shift_labels
            if num_items_in_batch is not None:
                kwargs["num_items_in_batch"] = num_items_in_batch
            return original_forward(*args, **kwargs)
        text_config = self.config.get_text_config()
        if kwargs.get("output_router_logits") or getattr(text_config, "output_router_logits", False):
            raise StreamBPError("streamfx's TRL head adapter does not compute the MoE load-balancing loss "
                                "(output_router_logits); train MoE models without the adapter")
        kwargs["use_cache"] = False
        hidden = getattr(self, backbone_attr)(*args, **kwargs).last_hidden_state
        shifted = shift_labels is None
        # Every position is scored against the next label (the last against none, -100), and the
        # per-token results are sliced afterwards: the head streams over the whole hidden state
        # (no slice of the hidden state between the last layer and the head).
        labels = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=-100) if shifted else shift_labels
        lm_head = self.get_output_embeddings()
        hidden = hidden.to(lm_head.weight.device)
        labels = labels.to(lm_head.weight.device)
        mask = labels != -100
        ctx = contextlib.nullcontext()
        if cast_fp32:
            hidden = hidden.float()
            ctx = torch.autocast(hidden.device.type, enabled=False)
        with ctx:
            z = torch.nn.functional.linear(hidden, lm_head.weight, lm_head.bias)
        z = z.float()
        if logit_scale != 1.0:
            z = z * logit_scale
        if softcap is not None:
            z = softcap * torch.tanh(z / softcap)
        if temperature != 1.0:
            z = z * (1 / temperature)
        logp = z.log_softmax(-1)
        index = labels.clamp(min=0)
        log_probs = logp.gather(-1, index.unsqueeze(-1)).squeeze(-1).masked_fill(~mask, 0)
        entropy = log_sum_sq = mean_logits = is_top1 = None
        if "entropy" in outputs:
            entropy = -(logp.exp() * logp).sum(-1).masked_fill(~mask, 0)
        if "log_sum_sq_probs" in outputs:
            log_sum_sq = torch.logsumexp(2 * logp, -1).detach().masked_fill(~mask, 0)
        if "mean_logits" in outputs:
            mean_logits = z.mean(-1).detach().masked_fill(~mask, 0)
        if "is_top1" in outputs:
            is_top1 = (z.argmax(-1) == index) & mask
        count = mask.sum().clamp(min=1) if num_items_in_batch is None else num_items_in_batch
        loss = -log_probs.sum() / count
        # The streamed head is what feeds sums over tokens: a per-token output that feeds none
        # (entropy, top-1...) would be computed outside it, from whole [B, T, V] values. Their sums
        # keep them inside (returned, unused by TRL: a few additions per token).
        sums = [x.float().sum() for x in (entropy, log_sum_sq, mean_logits, is_top1) if x is not None]
        per_token = [log_probs, entropy, log_sum_sq, mean_logits, is_top1, mask]
        if shifted:
            per_token = [None if x is None else x[:, :-1] for x in per_token]
        log_probs, entropy, log_sum_sq, mean_logits, is_top1, mask = per_token
        return output_cls(loss=loss, log_probs=log_probs, entropy=entropy, log_sum_sq_probs=log_sum_sq,
                          mean_logits=mean_logits, is_top1=is_top1, label_mask=mask,
                          per_token_sums=torch.stack(sums) if sums else None)

    # TRL's fused forward carries the model's forward signature (generate validates its kwargs
    # against it, the Trainer filters dataset columns with it): so does this one
    return functools.wraps(trl_function)(_fused_forward)


@functools.cache
def _output_class():
    """TRL's ``FusedCausalLMOutput`` with one more field: the sums over tokens of the extra per-token
    outputs (entropy, ...), which keep those outputs inside the streamed head."""
    from trl.trainer.utils import FusedCausalLMOutput

    @dataclasses.dataclass
    class StreamedFusedCausalLMOutput(FusedCausalLMOutput):
        per_token_sums: torch.Tensor | None = None

    return StreamedFusedCausalLMOutput


# ---- the trainer callback ------------------------------------------------------------------------
def _callback_base():
    try:
        from transformers import TrainerCallback
    except ImportError:  # pragma: no cover - transformers is an optional dependency
        return object
    return TrainerCallback


class StreamBPCallback(_callback_base()):
    """``Trainer(..., callbacks=[streamfx.StreamBPCallback()])``: trains with streambp.

    Works with ``transformers.Trainer`` and TRL's trainers (SFT, DPO, GRPO...). Compiles the
    trainer's model in place with ``streamfx.prepare`` when the trainer is built (and checks it
    again when training starts), and records per training step how many streamed regions ran
    forward and backward (``self.steps``); a training step in which nothing streamed gets a
    warning, so streaming is never lost silently. ``options`` and ``dynamic`` as for ``prepare``."""

    def __init__(self, *, dynamic: bool | None = None, **options):
        StreamConfig.from_options(options)
        self.options, self.dynamic = options, dynamic
        self.steps: list[dict] = []
        self._before: dict | None = None
        self._warned = False

    def _prepare(self, args, model):
        if getattr(args, "torch_compile", False):
            raise StreamBPError(
                f"TrainingArguments(torch_compile=True, torch_compile_backend={args.torch_compile_backend!r}) would "
                "compile the model a second time inside a torch.compile wrapper; StreamBPCallback compiles it with "
                "streambp in place: leave torch_compile and torch_compile_backend unset")
        if model is not None:
            prepare(model, dynamic=self.dynamic, **self.options)

    def on_init_end(self, args, state, control, model=None, **kwargs):
        self._prepare(args, model)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self._prepare(args, model)

    def on_step_begin(self, args, state, control, **kwargs):
        from .runtime import COUNTERS

        self._before = dict(COUNTERS)

    def on_step_end(self, args, state, control, **kwargs):
        from .runtime import COUNTERS

        if self._before is None:
            return
        step = {k: COUNTERS[k] - self._before.get(k, 0) for k in COUNTERS}
        step["step"] = state.global_step
        self.steps.append(step)
        self._before = None
        if step["region_backward"] == 0 and not self._warned:
            self._warned = True
            warnings.warn(f"streamfx: training step {state.global_step} ran no streamed region backward: the compiled "
                          "graph was bypassed or did not stream (see the warnings above, or streamfx.explain)")


# ---- accelerate's dynamo backend list -------------------------------------------------------------
def install_accelerate_hint() -> None:
    """Make accelerate's ``'STREAMBP' is not a valid DynamoBackend`` name the line that works
    (``TrainingArguments(torch_compile_backend="streambp")``, ``Accelerator(dynamo_backend="streambp")``)."""
    try:
        from accelerate.utils.dataclasses import DynamoBackend
    except Exception:  # noqa: BLE001 - accelerate absent or changed
        return
    original = DynamoBackend.__dict__.get("_missing_")
    if getattr(original, "__func__", None) is not None and getattr(original.__func__, "_streamfx", False):
        return
    fallback = original.__func__ if original is not None else None

    def _missing_(cls, value):
        if isinstance(value, str) and value.upper() == "STREAMBP":
            raise ValueError(
                "'streambp' is not one of accelerate's dynamo backends, and accelerate's torch.compile wrapper would "
                "hide forward's signature from the Trainer and be bypassed by TRL. Leave torch_compile_backend / "
                f"dynamo_backend unset and add {CALLBACK_LINE} to the trainer (accelerate or your own loop: "
                f"{PREPARE_LINE})")
        return fallback(cls, value) if fallback is not None else None

    _missing_._streamfx = True
    DynamoBackend._missing_ = classmethod(_missing_)


install_accelerate_hint()
