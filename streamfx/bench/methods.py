"""The training methods compared by the benchmark.

Contract:
  * ``METHODS`` maps a method name to a :class:`Method` (a one-line description plus what it
    needs).  The runner uses :func:`not_applicable` to turn a method that cannot run here into a
    row with a reason, without starting a worker.
  * :func:`prepare` runs inside a worker.  It receives the freshly built model and returns
    ``step(input_ids, labels) -> loss``: one full BP step (forward with labels, HF causal-LM loss,
    ``loss.backward()``) that leaves the gradients in ``model``'s parameters and returns the loss
    as a detached scalar tensor.  Compilation happens lazily, in the first call.
    With ``loss="shifted"`` the step computes the same loss outside the model, the way TRL-style
    code does: ``cross_entropy(logits[:, :-1], labels[:, 1:])`` on the logits the model returns
    (compiled together with the model by the compiling methods).
  * :func:`worker_env` lists the environment variables a method's worker process needs.
"""
from __future__ import annotations

import dataclasses


def hf_checkpointing(model, on: bool = True) -> None:
    """Hugging Face's activation checkpointing on (or off) ``model``: its
    ``activation_checkpointing_enable`` where the installed transformers has it, else
    ``gradient_checkpointing_enable`` (that method's name before; a deprecated alias since)."""
    name = "activation_checkpointing" if hasattr(model, "activation_checkpointing_enable") else "gradient_checkpointing"
    getattr(model, f"{name}_{'enable' if on else 'disable'}")()


def compile_checkpointed(model, **compile_kwargs):
    """``torch.compile(model, **compile_kwargs)`` of a model with Hugging Face's checkpointing on,
    as a callable that traces it with Dynamo's ``skip_fwd_side_effects_in_bwd_under_checkpoint``
    (where torch has it). transformers >= 5.25 routes its kernel-hub functions through a context
    variable the layer's forward sets and resets (the `kernels` package's `new_forward`): a side
    effect Dynamo's checkpoint operator refuses, so without the flag every checkpointed layer
    breaks the graph (its layers run eager, a recompile at the second length). The flag only
    stops the forward's side effects from being replayed in the backward's recompute; the
    variable is reset by the forward itself, so nothing of the step changes."""
    import torch
    import torch._dynamo.config as dynamo_config

    compiled = torch.compile(model, **compile_kwargs)
    if not hasattr(dynamo_config, "skip_fwd_side_effects_in_bwd_under_checkpoint"):
        return compiled

    def call(*args, **kwargs):
        with dynamo_config.patch(skip_fwd_side_effects_in_bwd_under_checkpoint=True):
            return compiled(*args, **kwargs)

    return call


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    description: str
    needs_cuda: bool = False
    reference: bool = False     # runs in the reference venv's interpreter


METHODS: dict[str, Method] = {m.name: m for m in [
    Method("eager", "PyTorch eager, every activation kept"),
    Method("ckpt", "eager + HF activation checkpointing (one checkpoint per layer)"),
    Method("inductor", "torch.compile(model) with default Inductor"),
    Method("auto_chunker", "torch.compile(model) with torch._inductor.config.auto_chunker.enable"),
    Method("membudget0", "torch.compile(model) with torch._functorch.config.activation_memory_budget = 0"),
    Method("streambp", "torch.compile(model, backend='streambp', options={...})"),
    Method("streambp-eager", "torch.compile(model, backend='streambp', options={'codegen': 'eager'})"),
    Method("streambp-offload", "streambp with options offload='cpu' on a GPU, 'disk' on the CPU (layer inputs "
           "off the device)"),
    Method("streambp-keep4", "streambp with options keep_every=4 (every 4th layer input kept, the others "
           "rebuilt in the backward)"),
    Method("streambp-offload-keep4", "streambp with both: offload as streambp-offload, keep_every=4"),
    Method("ckpt-offload", "eager + HF model.activation_checkpointing_enable(offload=True) (checkpointed "
           "layer inputs in pinned host memory)", needs_cuda=True),
    Method("reference", "reference StreamBP (PyPI package streambp, transformers 4.51.3) StreamModel; it "
           "divides the summed loss by the number of labels != -100 before the shift (n, where HF uses the "
           "n - 1 shifted targets), so its loss and gradients are (n-1)/n of eager's", reference=True),
    Method("liger", "Liger-Kernel Qwen3 patches (fused linear cross-entropy) + HF gradient checkpointing",
           needs_cuda=True),
]}

DEFAULT_METHODS = ["eager", "ckpt", "inductor", "auto_chunker", "membudget0", "streambp",
                   "streambp-eager", "reference", "liger"]


def parse_methods(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known methods: {list(METHODS)}")
    return names


def not_applicable(name: str, device: str, reference_python: str | None,
                   reference_error: str | None = None) -> str | None:
    """Why ``name`` cannot run on ``device`` (None when it can)."""
    method = METHODS[name]
    if method.needs_cuda and device != "cuda":
        return "needs CUDA"
    if method.reference:
        if reference_error:
            return reference_error
        if reference_python is None:
            return "not installed (pass --reference-venv to build its venv)"
    return None


def worker_env(name: str) -> dict[str, str]:
    if name == "auto_chunker":
        return {"TORCHINDUCTOR_AUTO_CHUNKER": "1"}
    return {}


LOSSES = ("model", "shifted")


def shifted_loss(model):
    """A module computing the causal-LM loss from the model's logits with the logits shifted."""
    import torch
    import torch.nn.functional as F

    class ShiftedLoss(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, labels):
            logits = self.model(input_ids=input_ids, use_cache=False).logits
            return F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten(),
                                   ignore_index=-100)

    return ShiftedLoss()


def _hf_step(model, extra=None):
    extra = dict(extra or {})

    def step(input_ids, labels):
        out = model(input_ids=input_ids, labels=labels, use_cache=False, **extra)
        out.loss.backward()
        return out.loss.detach()

    return step


def _loss_step(module):
    def step(input_ids, labels):
        loss = module(input_ids, labels)
        loss.backward()
        return loss.detach()

    return step


def _streambp_backend():
    """The 'streambp' backend name, registering streamfx's backend if its entry point is absent."""
    import torch._dynamo
    from torch._dynamo.backends.registry import register_backend

    from streamfx.backend import streambp_backend  # an ImportError here is the row's reason

    if "streambp" not in torch._dynamo.list_backends(exclude_tags=()):
        register_backend(streambp_backend, name="streambp")
    return "streambp"


def prepare(name: str, model, device: str, streambp_options: dict | None = None,
            reference_options: dict | None = None, seq: int = 0, loss: str = "model"):
    """Set ``model`` up for method ``name`` and return its BP step (see the module docstring)."""
    import torch

    if loss not in LOSSES:
        raise ValueError(f"unknown loss {loss!r}; known: {list(LOSSES)}")
    if loss == "shifted" and name in ("reference", "liger"):
        raise RuntimeError(f"method {name!r} computes the model's own loss only")
    target = model if loss == "model" else shifted_loss(model)
    step_of = _hf_step if loss == "model" else _loss_step
    if name == "eager":
        return step_of(target)
    if name == "ckpt":
        hf_checkpointing(model)
        return step_of(target)
    if name == "inductor":
        return step_of(torch.compile(target))
    if name == "auto_chunker":
        import torch._inductor.config as inductor_config

        if not hasattr(inductor_config, "auto_chunker"):
            raise RuntimeError(f"torch {torch.__version__} has no torch._inductor.config.auto_chunker")
        inductor_config.auto_chunker.enable = True
        return step_of(torch.compile(target))
    if name == "membudget0":
        import torch._functorch.config as functorch_config

        functorch_config.activation_memory_budget = 0.0
        return step_of(torch.compile(target))
    if name == "ckpt-offload":
        if not hasattr(model, "activation_checkpointing_enable"):
            raise RuntimeError("this transformers has no activation_checkpointing_enable(offload=True)")
        model.activation_checkpointing_enable(offload=True)
        return step_of(target)
    if name.startswith("streambp"):
        options = dict(streambp_options or {})
        if name == "streambp-eager":
            options["codegen"] = "eager"
        if "offload" in name:
            options.setdefault("offload", "cpu" if device == "cuda" else "disk")
        if "keep4" in name:
            options.setdefault("keep_every", 4)
        return step_of(torch.compile(target, backend=_streambp_backend(), options=options))
    if name == "reference":
        return _reference_step(model, seq, reference_options or {})
    if name == "liger":
        from liger_kernel.transformers import apply_liger_kernel_to_qwen3

        apply_liger_kernel_to_qwen3(model=model, fused_linear_cross_entropy=True, cross_entropy=False)
        hf_checkpointing(model)
        return _hf_step(model)
    raise ValueError(f"unknown method {name!r}")


def _reference_step(model, seq: int, options: dict):
    """The reference implementation's StreamModel wrapper (runs under transformers 4.51.3).

    StreamModel runs the backward pass inside its forward; its returned loss only needs a
    ``backward()`` when it still requires grad.
    """
    import torch
    from streambp.stream_model import StreamModel

    kwargs = {"gradient_accumulation_steps": 1, "logits_chunk_size": 100,
              "checkpoint_chunk_size": max(1, -(-seq // 4)), "stream_checkpoint": True}
    kwargs.update(options)
    stream = StreamModel(model, **kwargs)
    stream.gradient_checkpointing_enable()

    def step(input_ids, labels):
        out = stream(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), labels=labels,
                     use_cache=False, return_dict=True)
        loss = torch.as_tensor(out.loss)
        if loss.requires_grad:
            loss.backward()
        return loss.detach()

    return step
