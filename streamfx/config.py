"""User options of the streambp backend, validated before any compile work."""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

from .errors import StreamBPError

CODEGENS = ("inductor", "eager")
KV_BOUNDARIES = ("auto", "latent", "heads")
HEAD_GRADS = ("auto", "forward", "recompute")
OFFLOADS = (None, "auto", "cpu", "disk")
ATTENTIONS = ("recompute", "keep")


def inductor_modes() -> dict:
    """{torch.compile mode: the Inductor options it sets}, as the installed torch defines them."""
    import torch._inductor

    return torch._inductor.list_mode_options()


_CUDA_GRAPHS = ("CUDA graphs replay one recorded sequence of kernels at fixed addresses; a streamed step runs its "
                "chunk graphs from loops whose length follows each call's sequence length, with buffers "
                "allocated per call")

# Inductor options a streamed compile does not take, why, and what becomes of a mode that sets
# them: "refused" (the mode raises), "left" (the mode applies without it); given in
# ``inductor_options`` (set, for a flag), each raises
INDUCTOR_OPTIONS_NOT_TAKEN = {
    "triton.cudagraphs": (_CUDA_GRAPHS, "refused"),
    # ("lite"): the joint graph undecomposed; the passes read ATen's decompositions of the ops,
    # a loss's per-token form among them (``passes/rules.py``)
    "selective_decompose": ("the streaming passes read the joint graph with ATen's decompositions applied", "left"),
    "custom_partitioner_fn": ("streamfx's passes run in Inductor's partitioner slot", "refused"),
    "fx_graph_cache": ("the graphs that hold the streamed regions compile without Inductor's cache (their code "
                       "calls the regions this process registers); the chunk graphs use it", "refused"),
}


def inductor_mode_options(mode: str) -> dict:
    """The Inductor config patches of torch.compile's ``mode`` that a streamed compile applies."""
    return {k: v for k, v in inductor_modes()[mode].items() if k not in INDUCTOR_OPTIONS_NOT_TAKEN}


def _check_mode(mode, codegen: str) -> None:
    modes = inductor_modes()

    def refused(options):
        return [k for k, v in options.items() if v and INDUCTOR_OPTIONS_NOT_TAKEN.get(k, (None, None))[1] == "refused"]

    allowed = tuple(m for m, o in modes.items() if not refused(o))
    if not isinstance(mode, str) or mode not in modes:
        raise StreamBPError(f"option 'mode' must be one of {allowed}, got {mode!r}")
    not_taken = refused(modes[mode])
    if not_taken:
        why = "; ".join(INDUCTOR_OPTIONS_NOT_TAKEN[k][0] for k in not_taken)
        raise StreamBPError(f"mode {mode!r} sets {not_taken}: {why}. Use one of {allowed}"
                            + (" (max-autotune-no-cudagraphs tunes the kernels as max-autotune does)"
                               if "max-autotune-no-cudagraphs" in allowed and mode == "max-autotune" else ""))
    if mode != "default":
        _inductor_only("mode", mode, codegen)


def _check_inductor_options(options, codegen: str) -> None:
    if options is None:
        return
    if not isinstance(options, Mapping) or not all(isinstance(k, str) for k in options):
        raise StreamBPError(f"option 'inductor_options' must be a dict of Inductor option names "
                            f"(torch._inductor.config, as torch.compile(options=...) takes them for Inductor) "
                            f"to values, got {options!r}")
    from torch._inductor import config as inductor_config

    known = inductor_config.get_config_copy()
    unknown = sorted(k for k in options if k not in known)
    if unknown:
        raise StreamBPError(f"option 'inductor_options': {unknown} are not options of torch._inductor.config "
                            f"(e.g. 'max_autotune', 'coordinate_descent_tuning', 'epilogue_fusion')")
    not_taken = [k for k in options if k in INDUCTOR_OPTIONS_NOT_TAKEN
                 and (options[k] or not isinstance(known[k], bool))]
    if not_taken:
        raise StreamBPError("option 'inductor_options' sets " + "; ".join(
            f"{k!r}: {INDUCTOR_OPTIONS_NOT_TAKEN[k][0]}" for k in not_taken))
    if options:
        _inductor_only("inductor_options", options, codegen)


def _inductor_only(key: str, value, codegen: str) -> None:
    """An option that sets Inductor's options raises where nothing is compiled by Inductor."""
    if codegen != "inductor":
        raise StreamBPError(f"option {key!r} sets the Inductor options of a compile; with codegen={codegen!r} "
                            f"nothing is compiled by Inductor: drop {key}={value!r} or use codegen='inductor'")


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """Options of ``torch.compile(m, backend="streambp", options={...})``.

    chunk_size:      tokens per chunk in streamed layer regions; None picks one automatically.
    head_chunk_size: tokens per chunk in the LM head + loss region; None picks one automatically.
    codegen:         "inductor" compiles every graph with Inductor; "eager" runs the rewritten
                     FX graphs as they are (fast to compile, good for debugging).
    mode:            torch.compile's ``mode`` (also given as ``torch.compile(..., mode=...)``):
                     the Inductor options of that mode (``torch._inductor.list_mode_options``)
                     apply to every graph streamfx compiles, the chunk graphs included, e.g.
                     "max-autotune-no-cudagraphs" (see ``INDUCTOR_OPTIONS_NOT_TAKEN``: "lite"
                     runs decomposed). Modes that turn on CUDA graphs are refused:
                     a streamed step runs its chunk graphs from loops whose length follows the
                     call's, with buffers allocated per call, which a replayed graph cannot.
    inductor_options: Inductor's own options (``torch._inductor.config`` names, as
                     ``torch.compile(options=...)`` takes them for Inductor), applied to every
                     graph streamfx compiles after those of ``mode``, e.g.
                     {"max_autotune_gemm_backends": "TRITON"}; those of
                     ``INDUCTOR_OPTIONS_NOT_TAKEN`` raise.
    dump_dir:        write graphviz/text dumps of every graph and pass here
                     (the environment variable STREAMFX_DUMP_DIR does the same).
    strict:          raise StreamBPError instead of falling back when streaming cannot apply.
    return_logits:   keep the [B, T, V] logits output when the graph also computes a loss.
    kv_boundary:     what a streamed layer keeps for the whole sequence to read keys from:
                     "heads", its keys and values; "latent", the narrowest tensors they are
                     computed from (multi-head latent attention's compressed latent and rotary
                     key), each chunk then rebuilding the keys and values of its prefix;
                     "auto", the latent where that keeps fewer bytes (see passes/kv.py).
    head_grad:       how the LM head + loss region gets its gradients: "forward", computed in
                     the forward pass for each loss value (one logits product per chunk; its
                     input is not kept); "recompute", its backward recomputes each chunk;
                     "auto", "forward" where one value (the loss) carries a gradient, else
                     "recompute" (see passes/plan.py, ``grad_seeds``).
    offload:         where the layer inputs kept for the backward live: None, device memory
                     (with a memory_budget, no keep_every and attention="recompute": "auto"); "cpu", pinned host memory
                     (copied on a side stream, read back a layer ahead); "disk", files under
                     ``offload_dir`` (removed with the step's autograd graph); "auto", chosen per
                     call with keep_every by the memory model: device memory where the step fits
                     the budget, else the offload tier (a GPU: "cpu", a CPU device: "disk") with
                     the smallest keep_every that fits (needs a memory_budget, or a GPU).
    offload_dir:     the directory of offload="disk" files; None is the system temporary directory.
    keep_every:      keep every k-th layer input of consecutive layers in one graph and rebuild the
                     others in the backward by a streamed forward from the kept one (1: keep all;
                     None: keep all, or chosen per call under offload="auto").
    attention:       what a streamed layer's backward does for its fused causal attention:
                     "recompute", run its forward again per chunk (as checkpointing does);
                     "keep", read its output and log-sum-exp kept from the forward (the kernel's
                     backward from them: the attention's forward runs once per step, for the
                     output and log-sum-exp of every layer kept in memory: heads x head_dim x
                     dtype bytes + heads x 4 bytes per token per layer), with or without a data
                     mask (padding, packed documents, a sliding window: the kernel's backward
                     takes the chunk's mask). A layer whose attention runs on a kernel whose
                     backward cannot read them (see passes/kernels.py, ``Kernel.keeps``), or has
                     no fused attention, keeps nothing, with a warning.
                     Not with offload or keep_every; with a memory_budget (or on a GPU) the
                     memory model counts the kept tensors in each call's chunk sizes, and the
                     layer inputs stay in device memory (no offload="auto").
    memory_budget:   the memory a training step may reach, parameters, gradients and what is
                     held before the step included: bytes (an int), a string ("70GiB",
                     "512MiB", "80GB") or a fraction of the device's memory (a float in (0, 1]).
                     Each call's automatic chunk sizes are then the largest the memory model
                     (streamfx.plan_memory) predicts to fit at that call's length; a length that
                     fits no chunk size raises StreamBPError before its step. None: on a GPU the
                     free device memory, on a CPU the fixed rules of passes/schedule.py.
    """

    chunk_size: int | None = None
    head_chunk_size: int | None = None
    codegen: str = "inductor"
    mode: str = "default"
    inductor_options: Mapping[str, Any] | None = None
    dump_dir: str | None = None
    strict: bool = False
    return_logits: bool = False
    kv_boundary: str = "auto"
    head_grad: str = "auto"
    offload: str | None = None
    offload_dir: str | None = None
    keep_every: int | None = None
    memory_budget: int | float | str | None = None
    attention: str = "recompute"

    def __post_init__(self) -> None:
        for key in ("chunk_size", "head_chunk_size"):
            value = getattr(self, key)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise StreamBPError(f"option {key!r} must be a positive int or None, got {value!r}")
        if self.codegen not in CODEGENS:
            raise StreamBPError(f"option 'codegen' must be one of {CODEGENS}, got {self.codegen!r}")
        _check_mode(self.mode, self.codegen)
        _check_inductor_options(self.inductor_options, self.codegen)
        if self.kv_boundary not in KV_BOUNDARIES:
            raise StreamBPError(f"option 'kv_boundary' must be one of {KV_BOUNDARIES}, got {self.kv_boundary!r}")
        if self.head_grad not in HEAD_GRADS:
            raise StreamBPError(f"option 'head_grad' must be one of {HEAD_GRADS}, got {self.head_grad!r}")
        if self.memory_budget is not None:
            from .membudget import parse_budget

            parse_budget(self.memory_budget)   # raises with the allowed forms
        if self.dump_dir is not None:
            _check_dump_dir(self.dump_dir, "option 'dump_dir'")
        if self.offload not in OFFLOADS:
            raise StreamBPError(f"option 'offload' must be one of {OFFLOADS}, got {self.offload!r}")
        if self.offload_dir is not None:
            _check_dump_dir(self.offload_dir, "option 'offload_dir'")
        keep = self.keep_every
        if keep is not None and (isinstance(keep, bool) or not isinstance(keep, int) or keep <= 0):
            raise StreamBPError(f"option 'keep_every' must be a positive int or None, got {keep!r}")
        if self.offload == "auto" and self.keep_every is not None:
            raise StreamBPError(f"option 'keep_every' must be None with offload='auto' (which chooses it per call), "
                                f"got {self.keep_every!r}")
        if self.attention not in ATTENTIONS:
            raise StreamBPError(f"option 'attention' must be one of {ATTENTIONS}, got {self.attention!r}")
        if self.attention == "keep":
            clash = [f"{k}={getattr(self, k)!r}" for k in ("offload", "keep_every") if getattr(self, k) not in (None, 1)]
            if clash:
                raise StreamBPError(f"option attention='keep' keeps every layer's attention output for its backward, "
                                    f"which the layer-input storage options do not plan for; "
                                    f"drop {', '.join(clash)} or use attention='recompute'")
        for key in ("strict", "return_logits"):
            if not isinstance(getattr(self, key), bool):
                raise StreamBPError(f"option {key!r} must be True or False, got {getattr(self, key)!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any] | None) -> "StreamConfig":
        """Build a config from a torch.compile ``options`` dict; unknown keys raise."""
        options = dict(options or {})
        allowed = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(options) - set(allowed))
        if unknown:
            raise StreamBPError(f"unknown option(s) {unknown}; allowed options are {allowed}")
        return cls(**options)

    @property
    def inductor_patches(self) -> dict:
        """The Inductor config patches of every Inductor compile of the step: ``mode``'s, then
        ``inductor_options``."""
        return {**inductor_mode_options(self.mode), **(self.inductor_options or {})}

    @property
    def storage_auto(self) -> bool:
        """Whether each call chooses where layer inputs live (``streamfx.offload``, "auto")."""
        return self.offload == "auto" or (self.offload is None and self.keep_every is None
                                          and self.memory_budget is not None and self.attention != "keep")

    @property
    def effective_dump_dir(self) -> str | None:
        if self.dump_dir is not None:
            return os.fspath(self.dump_dir)
        env = os.environ.get("STREAMFX_DUMP_DIR")
        if env:
            _check_dump_dir(env, "STREAMFX_DUMP_DIR")
        return env or None


def _check_dump_dir(path, what: str) -> None:
    """A dump directory is a non-empty path that is a directory or can be made one (nothing is
    created here: every existing part of it must be a directory, the nearest one writable)."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise StreamBPError(f"{what} must be a non-empty directory path or None, got {path!r}")
    p = os.path.abspath(os.fspath(path))
    probe = p
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise StreamBPError(f"{what} must be a directory path, got {path!r} ({probe!r} is a file)")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise StreamBPError(f"{what}: {probe!r} is not writable (from {path!r})")
