"""The measurements of ``python -m streamfx.bench gpu``, each a function of a :class:`Setup`.

Contract: every part returns a list of row dicts and never raises for what a method does (an
out-of-memory step, a kernel the device lacks, a compile that fails: a row with the reason).
Each part stops starting new measurements at ``setup.deadline`` (``time.monotonic()``) and
records what it left out. All run in this process: the longest-length search keeps its compiled
graphs across probes (one dynamic compile per method), which a process per probe would not.

The compared methods (:data:`METHODS`): streamfx (``backend="streambp"``), Hugging Face gradient
checkpointing in eager, the same checkpointing under ``torch.compile``, and streamfx with
``attention="keep"`` (each layer's attention output and log-sum-exp kept from the forward; not in
:data:`DEFAULT_METHODS`); every compile is ``dynamic=True``, so no length recompiles.
"""
from __future__ import annotations

import copy
import dataclasses
import gc
import math
import statistics
import time
import warnings

from . import presets as presets_mod
from .methods import compile_checkpointed, hf_checkpointing
from .worker import _malloc_trim, _proc_status_bytes, _reset_hwm, compare_grads, describe_exception, is_oom

METHODS = ("streamfx", "ckpt", "ckpt+compile", "streamfx+keep")
DEFAULT_METHODS = ("streamfx", "ckpt", "ckpt+compile")   # (streamfx+keep: asked for with --methods)
KERNELS = ("flash", "efficient", "cudnn")


@dataclasses.dataclass
class Setup:
    """Where and how big: the device, the presets and lengths of each part, the time left."""

    device: str
    kernel_preset: str
    kernel_seq: int
    memory_preset: str
    memory_seqs: tuple
    speed_preset: str
    speed_seq: int
    speed_repeats: int
    max_len_step: int
    max_len_limit: int          # no probe above this length
    mem_cap_bytes: int | None   # None: the device's memory
    streamfx_options: dict
    compile_backend: str        # the checkpointing row's torch.compile backend ("inductor"; tiny: "aot_eager")
    methods: tuple = DEFAULT_METHODS    # the methods the memory, max_len and speed parts run
    mode: str = "default"               # torch.compile's mode of the memory, max_len and speed parts' compiles
    offload_seq: int = 4096     # the offload part's length (the kernel preset)
    offload_chunk: int = 512
    deadline: float = float("inf")

    def left(self) -> float:
        return self.deadline - time.monotonic()


# ---------------------------------------------------------------- a plain causal transformer
def plain_model(preset, device: str):
    """A nanoGPT-style causal LM of the preset's sizes with as many K/V heads as query heads,
    calling ``F.scaled_dot_product_attention(q, k, v, is_causal=True)`` with no mask: how plain
    PyTorch models (and Hugging Face's eager calls) reach the fused kernels. Hugging Face models
    under torch.compile hand SDPA a boolean mask instead, which flash cannot take."""
    import collections

    import torch
    import torch.nn.functional as F
    from torch import nn

    Out = collections.namedtuple("Out", "loss")
    d, heads, hd = preset.hidden_size, preset.num_attention_heads, preset.head_dim

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(d), nn.RMSNorm(d)
            self.qkv, self.o = nn.Linear(d, 3 * heads * hd, bias=False), nn.Linear(heads * hd, d, bias=False)
            self.up, self.down = nn.Linear(d, preset.intermediate_size, bias=False), \
                nn.Linear(preset.intermediate_size, d, bias=False)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).view(B, T, 3, heads, hd).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.o(a.transpose(1, 2).reshape(B, T, heads * hd))
            return x + self.down(F.gelu(self.up(self.n2(x))))

    class PlainLM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(preset.vocab_size, d)
            self.blocks = nn.ModuleList(Block() for _ in range(preset.num_hidden_layers))
            self.norm, self.head = nn.RMSNorm(d), nn.Linear(d, preset.vocab_size, bias=False)

        def forward(self, input_ids, labels, use_cache=False):
            x = self.embed(input_ids)
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.norm(x)).float()
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=presets_mod.IGNORE_INDEX)
            return Out(loss)

    torch.manual_seed(0)
    with torch.device(device):
        model = PlainLM()
    presets_mod.init_weights(model, 0)
    return model.train()


# ---------------------------------------------------------------- memory and steps
class Peak:
    """Peak memory of a block: the CUDA allocator's allocated and reserved peaks; on CPU the
    process's RSS high-water mark (reported as reserved; allocated is unknown there)."""

    def __init__(self, device: str):
        self.device, self.allocated, self.reserved = device, None, None

    def __enter__(self):
        import torch

        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        else:
            _malloc_trim()
            _reset_hwm()
        return self

    def __exit__(self, *exc):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.allocated, self.reserved = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
        else:
            self.reserved = _proc_status_bytes("VmHWM")
        return False


def _free(device: str) -> None:
    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def build(preset_name: str, dtype: str, device: str, max_seq: int):
    preset = presets_mod.get_preset(preset_name)
    return preset, presets_mod.build_model(preset, dtype, device, seed=0, max_seq=max_seq)


def per_method(model) -> dict:
    """Method -> the model it runs: the built one for streamfx, and for both checkpointing rows
    a second module tree over the same parameters and buffers (no copy of their memory) with
    checkpointing on. Switching one model's checkpointing instead would change state Dynamo
    guards on (hooks, attributes) and recompile every method."""
    tensors = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    twin = copy.deepcopy(model, memo=dict(tensors))
    hf_checkpointing(twin)
    keeping = copy.deepcopy(model, memo=dict(tensors))   # (its own compile, with other options)
    return {"streamfx": model, "ckpt": twin, "ckpt+compile": twin, "streamfx+keep": keeping}


def stepper(method: str, model, setup: Setup):
    """``step(ids, labels) -> loss``: one BP step (forward with labels, backward; no optimizer)."""
    import torch

    from .methods import _streambp_backend

    mode = {} if setup.mode == "default" else {"mode": setup.mode}
    if method.startswith("streamfx"):
        options = {**setup.streamfx_options, **({"attention": "keep"} if method == "streamfx+keep" else {}), **mode}
        target = torch.compile(model, backend=_streambp_backend(), options=options, dynamic=True)
    else:
        target = model if method == "ckpt" else compile_checkpointed(model, backend=setup.compile_backend, dynamic=True,
                                                                    **mode)

    def step(ids, labels):
        model.zero_grad(set_to_none=True)
        loss = target(input_ids=ids, labels=labels, use_cache=False).loss
        loss.backward()
        return loss.detach()

    step.clear = lambda: model.zero_grad(set_to_none=True)   # (the last step's gradients freed)
    return step


def _sync(device):
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def measured_step(step, preset, seq: int, setup: Setup) -> dict:
    """One step at ``seq`` tokens: its peaks and seconds, or status "oom" / "error" and why."""
    from streamfx.chunks import COUNTERS as CHUNK_COUNTERS
    from streamfx.runtime import COUNTERS

    ids, labels = presets_mod.make_batch(preset, seq, setup.device)
    row = {"seq": seq}
    before = (_compiles(), COUNTERS["chunks_forward"], COUNTERS["region_forward"],
              CHUNK_COUNTERS["vjp_compiles"], CHUNK_COUNTERS["vjp_fallbacks"])
    caught = []
    step.clear()   # (memory held before the step: the weights, not the last step's gradients)
    try:
        with Peak(setup.device) as peak, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if setup.device == "cuda":
                import torch

                row["before"] = torch.cuda.memory_allocated()
            start = time.perf_counter()
            step(ids, labels)
            _sync(setup.device)
            row["seconds"] = time.perf_counter() - start
        row.update(status="ok", allocated=peak.allocated, reserved=peak.reserved)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        row.update(status="oom" if is_oom(exc) else "error", reason=describe_exception(exc))
    # what the step did: graphs compiled (Dynamo's and streamfx's chunk graphs, and chunk graphs
    # compiled again at this step's sizes), regions run, of them chunk by chunk, and the first
    # streamfx warning
    row["compiled"] = _compiled_since(before[0])
    row["chunks"] = f"{COUNTERS['chunks_forward'] - before[1]}/{COUNTERS['region_forward'] - before[2]}"
    # backward chunks compiled as one graph each, and those that fell back to the training compile
    row["vjp"] = f"{CHUNK_COUNTERS['vjp_compiles'] - before[3]}/{CHUNK_COUNTERS['vjp_fallbacks'] - before[4]}"
    notes = _streamfx_notes(caught)
    if notes and "reason" not in row:
        row["reason"] = notes[0][:300]
    _free(setup.device)
    return row


def _streamfx_notes(caught) -> list[str]:
    """The streamfx warnings among warnings caught with ``warnings.catch_warnings(record=True)``."""
    return [str(w.message) for w in caught if "streamfx" in str(w.message)]


def _compiles() -> tuple:
    """(Dynamo's graphs, streamfx's chunk graphs, chunk graphs compiled again for a call whose sizes
    broke a shape guard of their compiles) compiled so far in this process."""
    from torch._dynamo.utils import counters
    from streamfx.chunks import COUNTERS

    return int(counters["stats"].get("unique_graphs", 0)), COUNTERS["chunk_compiles"], COUNTERS["guard_recompiles"]


def _compiled_since(before: tuple) -> str:
    """What compiled since ``before`` (``_compiles()``): "Dynamo+chunk", then "+N" where N chunk
    graphs compiled again at a call's sizes."""
    now = _compiles()
    again = now[2] - before[2]
    return f"{now[0] - before[0]}+{now[1] - before[1]}" + (f"+{again}" if again else "")


# ---------------------------------------------------------------- part 1: kernel forms
def kernels(setup: Setup) -> list[dict]:
    """Per SDPA kernel form and dtype (small model): whether streamfx streams the graph, and its
    largest relative gradient error against eager with the same kernel; eager's own error against
    fp32 with the math kernel gives the scale of that dtype's rounding."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "cudnn": SDPBackend.CUDNN_ATTENTION}
    preset, hf = build(setup.kernel_preset, "float32", setup.device, setup.kernel_seq)
    ids, labels = presets_mod.make_batch(preset, setup.kernel_seq, setup.device)
    rows = []
    for form, base in (("hf", hf), ("plain", plain_model(preset, setup.device))):
        with sdpa_kernel(SDPBackend.MATH):
            exact = _grads(base, ids, labels)
        for dtype in ("bfloat16", "float32"):
            for name in KERNELS:
                row = {"model": form, "kernel": name, "dtype": dtype}
                rows.append(row)
                if setup.left() <= 0:
                    row.update(status="skipped", reason="time budget spent")
                    continue
                model = copy.deepcopy(base).to(presets_mod.torch_dtype(dtype))
                note = ""
                try:
                    with sdpa_kernel(backends[name]):
                        ref = _grads(model, ids, labels)
                except Exception as exc:  # noqa: BLE001 - eager cannot run this kernel on these inputs
                    note = f"eager on the default kernels (eager on {name}: {describe_exception(exc)[:120]}); "
                    ref = _grads(model, ids, labels)
                try:
                    with sdpa_kernel(backends[name]):
                        row.update(_streamed_grads(model, ids, labels, setup))
                except Exception as exc:  # noqa: BLE001 - a kernel this device or dtype lacks, or a failure
                    # unavailable: eager could not run the kernel either, or torch.compile cannot
                    # trace the model with it whatever the backend; else streamfx's error
                    torch._dynamo.reset()
                    alone = "" if note else _dynamo_alone_fails(model, ids, labels, backends[name])
                    row.update(status="unavailable" if note or alone else "error",
                               reason=note + alone + describe_exception(exc))
                    continue
                row["reason"] = note + row.get("reason", "")
                row["grad_error"] = compare_grads(row.pop("grads"), ref)[0]
                row["eager_rounding"] = compare_grads(ref, exact)[0]
                torch._dynamo.reset()
        del base
    _free(setup.device)
    return rows


def _dynamo_alone_fails(model, ids, labels, backend) -> str:
    """Why torch.compile fails on this model with this kernel without streamfx (Dynamo and
    AOTAutograd with no code generation, ``backend="aot_eager"``), or "" where it runs."""
    import torch
    from torch.nn.attention import sdpa_kernel

    try:
        with sdpa_kernel(backend):
            m = copy.deepcopy(model)
            torch.compile(m, backend="aot_eager")(input_ids=ids, labels=labels, use_cache=False).loss.backward()
    except Exception as exc:  # noqa: BLE001 - reported in the row
        return f"torch.compile without streamfx fails too (backend aot_eager: {describe_exception(exc)[:120]}); "
    finally:
        torch._dynamo.reset()   # (the next row compiles afresh)
    return ""


def _grads(model, ids, labels) -> dict:
    model = copy.deepcopy(model)
    model(input_ids=ids, labels=labels, use_cache=False).loss.backward()
    return {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}


def _streamed_grads(model, ids, labels, setup: Setup) -> dict:
    """streamfx's gradients (Inductor left out: the kernel choice is in the graph), and whether
    it streamed: regions ran chunk by chunk and streamfx warned of nothing."""
    import torch

    from streamfx.runtime import COUNTERS

    from .methods import _streambp_backend

    model = copy.deepcopy(model)
    compiled = torch.compile(model, backend=_streambp_backend(), options={**setup.streamfx_options, "codegen": "eager"})
    before = COUNTERS["chunks_forward"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        compiled(input_ids=ids, labels=labels, use_cache=False).loss.backward()
    notes = _streamfx_notes(caught)
    streamed = COUNTERS["chunks_forward"] > before and not notes
    return {"status": "ok", "streamed": streamed, "reason": notes[0][:200] if notes else "",
            "grads": {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}}


# ---------------------------------------------------------------- part 1b: layer inputs off the device
def offload(setup: Setup) -> list[dict]:
    """Small model, fp32: streamfx with its layer inputs kept on the device, offloaded (pinned host
    memory on CUDA, files on CPU), rebuilt from every 2nd one, and both: the gradient error against
    eager, the step's peak rise of allocated memory (CUDA) and its time, after a step that compiles."""
    import torch

    from streamfx.runtime import COUNTERS

    from .methods import _streambp_backend

    tier = "cpu" if setup.device == "cuda" else "disk"
    variants = [("on device", {}), (f"offload={tier}", {"offload": tier}), ("keep_every=2", {"keep_every": 2}),
                (f"offload={tier}, keep_every=2", {"offload": tier, "keep_every": 2})]
    preset, base = build(setup.kernel_preset, "float32", setup.device, setup.offload_seq)
    ids, labels = presets_mod.make_batch(preset, setup.offload_seq, setup.device)
    ref = _grads(base, ids, labels)
    rows = []
    for name, opts in variants:
        row = {"variant": name, "seq": setup.offload_seq}
        rows.append(row)
        if setup.left() <= 0:
            row.update(status="skipped", reason="time budget spent")
            continue
        model = copy.deepcopy(base)
        options = {**setup.streamfx_options, "codegen": "eager", "chunk_size": setup.offload_chunk,
                   "head_chunk_size": setup.offload_chunk, **opts}
        compiled = torch.compile(model, backend=_streambp_backend(), options=options)

        def step(ids, labels, compiled=compiled, model=model):
            model.zero_grad(set_to_none=True)
            compiled(input_ids=ids, labels=labels, use_cache=False).loss.backward()

        step.clear = lambda model=model: model.zero_grad(set_to_none=True)

        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                step(ids, labels)  # compiles
                before = dict(COUNTERS)
                row.update(measured_step(step, preset, setup.offload_seq, setup))
            notes = _streamfx_notes(caught)
            row["streamed"] = COUNTERS["region_forward"] > before.get("region_forward", 0) and not notes
            row["moved"] = {k: COUNTERS[k] - before.get(k, 0) for k in ("inputs_offloaded", "inputs_dropped",
                                                                          "inputs_rebuilt", "inputs_loaded")}
            if notes:
                row["reason"] = notes[0][:200]
            if row.get("status") == "ok":
                got = {n: p.grad.detach().float().cpu() for n, p in model.named_parameters() if p.grad is not None}
                row["grad_error"] = compare_grads(got, ref)[0]
                if row.get("before") is not None:
                    row["rise"] = row["allocated"] - row["before"]
        except Exception as exc:  # noqa: BLE001 - reported in the table
            row.update(status="error", reason=describe_exception(exc))
        del model, compiled
        torch._dynamo.reset()
        _free(setup.device)
    del base
    _free(setup.device)
    return rows


# ---------------------------------------------------------------- part 2: memory at 4 lengths
def memory(setup: Setup, state: dict) -> list[dict]:
    """Peak allocated and reserved memory of one BP step per method and length (the large model,
    bf16). The first length is stepped twice and measured the second time (compiles excluded).
    Keeps the model, each method's step and its fit of memory against length in ``state``."""
    preset, model = build(setup.memory_preset, "bfloat16", setup.device, setup.max_len_limit)
    models = per_method(model)
    state.update(preset=preset, model=model, steps={}, fits={}, longest={}, times={})
    rows = []
    for method in setup.methods:
        step = state["steps"][method] = stepper(method, models[method], setup)
        warm = False
        for seq in setup.memory_seqs:
            if setup.left() <= 0:
                rows.append({"method": method, "seq": seq, "status": "skipped", "reason": "time budget spent"})
                continue
            first = None
            if not warm:
                first = measured_step(step, preset, seq, setup)  # compiles
                warm = True
            row = {"method": method, **measured_step(step, preset, seq, setup)}
            if first is not None:
                row["first_seconds"], row["vjp"] = first.get("seconds"), first.get("vjp")
                if first["status"] != "ok":   # (a step that fails once must not pass unseen)
                    row["reason"] = f"first step {first['status']}: {first.get('reason')}; " + (row.get("reason") or "")
            rows.append(row)
        ok = [(r["seq"], r["reserved"]) for r in rows if r["method"] == method and r["status"] == "ok"]
        state["fits"][method], state["longest"][method] = _linear_fit(ok), max((s for s, _ in ok), default=0)
        state["times"][method] = [(r["seq"], r["seconds"]) for r in rows
                                  if r["method"] == method and r["status"] == "ok" and r.get("seconds")]
    return rows


def _linear_fit(points):
    """(intercept, slope) of least squares, or None under two points."""
    if len(points) < 2:
        return None
    n = len(points)
    mx, my = sum(p[0] for p in points) / n, sum(p[1] for p in points) / n
    sxx = sum((p[0] - mx) ** 2 for p in points)
    slope = sum((p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


# ---------------------------------------------------------------- part 3: the longest length
def max_len(setup: Setup, state: dict) -> list[dict]:
    """Per method, the longest length whose step fits the memory cap: bisection between the
    longest measured length that fits and the first that does not, seeded by the memory part's
    linear fit, with the method's one dynamic compile (the number of compiles is reported)."""
    import torch

    cap = setup.mem_cap_bytes or (torch.cuda.mem_get_info()[1] if setup.device == "cuda" else None)
    rows = []
    for method in setup.methods:
        step, fit = state.get("steps", {}).get(method), state.get("fits", {}).get(method)
        row = {"method": method, "cap": cap}
        rows.append(row)
        if step is None or cap is None:
            row.update(status="skipped", reason="no memory part" if step is None else "no memory cap on this device")
            continue
        row.update(_bisect(step, state["preset"], fit, state["longest"][method], cap, setup,
                           times=state.get("times", {}).get(method, [])))
    return rows


def _step_seconds(times):
    """(seconds, longest): a step's seconds as a function of its length and the longest length
    whose step takes at most a given time, from measured (length, seconds) pairs: the
    least-squares fit of ``b T + c T^2`` with b, c >= 0 (the projections grow with T, attention
    with T^2); None under two pairs."""
    if len(times) < 2:
        return None
    s2, s3, s4 = (sum(t ** k for t, _ in times) for k in (2, 3, 4))
    y1, y2 = sum(t * y for t, y in times), sum(t * t * y for t, y in times)
    det = s2 * s4 - s3 * s3
    b, c = ((y1 * s4 - y2 * s3) / det, (s2 * y2 - s3 * y1) / det) if det > 0 else (y1 / s2, 0.0)
    if c < 0:
        b, c = y1 / s2, 0.0
    elif b < 0:
        b, c = 0.0, y2 / s4

    def longest(seconds: float) -> float:
        if c > 0:
            return (-b + math.sqrt(b * b + 4 * c * max(0.0, seconds))) / (2 * c)
        return seconds / b if b > 0 else math.inf

    return (lambda n: b * n + c * n * n), longest


def _bisect(step, preset, fit, fitting: int, cap, setup: Setup, times=()) -> dict:
    """Bisection from ``fitting`` (a length known to fit) and the fit's guess. ``times``: the
    (length, seconds) of steps measured before; with two or more, a probe that would not end
    within the part's time left is shortened to one that would (``_step_seconds``; on a device
    with far more memory than the measured lengths use, one probe at the guess can outlast the
    whole command), or not made."""
    quantum = setup.max_len_step
    guess = int((cap - fit[0]) / fit[1]) if fit and fit[1] > 0 else 2 * max(setup.memory_seqs)
    lo, hi, probes, last_s, before = fitting, None, [], 0.0, _compiles()
    times = list(times)
    probe = max(lo + quantum, min(guess, setup.max_len_limit) // quantum * quantum)
    while True:
        model = _step_seconds(times)
        if model is None and last_s * 2 > setup.left():  # (a probe takes at most about twice the last one's time)
            reason = "time budget spent"
            break
        if model is not None:
            seconds, longest = model
            allowed = 0.8 * setup.left()   # (the fit's error, and the step's own overhead)
            if seconds(probe) > allowed:
                within = int(min(probe, longest(allowed))) // quantum * quantum
                if within <= lo:
                    reason = (f"time budget spent: a step at {probe} tokens would take about "
                              f"{seconds(probe):.0f} s, {max(0.0, setup.left()):.0f} s left")
                    break
                probe = within
        r = measured_step(step, preset, probe, setup)
        fits = r["status"] == "ok" and r["reserved"] <= cap
        probes.append((probe, "fits" if fits else r.get("status")))
        last_s = r.get("seconds", last_s)
        if r["status"] == "ok" and r.get("seconds"):
            times.append((probe, r["seconds"]))
        lo, hi = (max(lo, probe), hi) if fits else (lo, probe if hi is None else min(hi, probe))
        if hi is None and probe >= setup.max_len_limit:
            reason = f"fits at the search limit {setup.max_len_limit}"
            break
        if hi is not None and hi - lo <= quantum:
            reason = ""
            break
        probe = min(setup.max_len_limit, probe * 5 // 4) if hi is None else (lo + hi) // 2
        probe = max(quantum, probe // quantum * quantum)
        if probe in (lo, hi):
            reason = ""
            break
    return {"status": "ok" if lo else "none fits", "max_len": lo or None, "first_failure": hi,
            "probes": probes, "compiles": _compiled_since(before), "reason": reason}


# ---------------------------------------------------------------- part 4: step time
def speed(setup: Setup) -> list[dict]:
    """Median step time at one length (the paper's comparison: a Qwen3-4B shape at 24k tokens)
    per method, after a step that compiles; its peak memory too."""
    preset, model = build(setup.speed_preset, "bfloat16", setup.device, setup.speed_seq)
    models, rows = per_method(model), []
    for method in setup.methods:
        if setup.left() <= 0:
            rows.append({"method": method, "status": "skipped", "reason": "time budget spent"})
            continue
        step = stepper(method, models[method], setup)
        first = measured_step(step, preset, setup.speed_seq, setup)
        runs = [first] if first["status"] != "ok" else \
            [measured_step(step, preset, setup.speed_seq, setup) for _ in range(setup.speed_repeats)]
        ok = [r for r in runs if r["status"] == "ok"]
        row = {"method": method, "seq": setup.speed_seq, "first_seconds": first.get("seconds")}
        row.update(ok[-1] if len(ok) == len(runs) else runs[-1])
        row["vjp"] = first.get("vjp")   # (compiled in the first step)
        if ok and len(ok) == len(runs):
            row["seconds"] = statistics.median(r["seconds"] for r in ok)
        rows.append(row)
    del model, models
    _free(setup.device)
    return rows
