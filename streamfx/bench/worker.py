"""One measurement in a fresh process: ``python -m streamfx.bench.worker --json-args '{...}'``.

The runner starts one worker per (preset, method, sequence length) so that every peak-memory
number starts from a clean process.  Arguments (a JSON object):

  mode           "measure" (default) or "probe" (GPU max-length search: does one step fit?)
  preset, method, seq, dtype, device, seed, repeats
  result_path    where the result JSON is written (always written unless the process dies)
  ref_path       eager gradient file: the eager worker writes it, the others compare against it
  grad_sample    gradient elements kept per parameter for the comparison (strided sample)
  streambp_options, reference_options   options passed to those methods
  loss           "model" (the model's own loss) or "shifted" (see methods.prepare)
  mem_cap_bytes  probe mode: cap on CUDA memory (torch.cuda.set_per_process_memory_fraction)
  layers         the preset with this many layers instead of its own
  keep_grads     the gradient buffers exist before the memory step (zeroed, not freed), so its
                 rise leaves them out; repeats 0 skips the timed steps

Measurement protocol (mode "measure"; on CPU the whole process runs with fixed glibc malloc
thresholds, see :func:`fix_malloc_thresholds`):
  1. build the seeded model and batch (:mod:`streamfx.bench.presets`) and prepare the method;
  2. one warm-up step (compiles), then ``repeats`` timed steps; ``median_time_s`` is their
     median (``zero_grad(set_to_none=True)`` before every step, outside the timed region);
  3. memory step.  CPU: gc + malloc_trim, read VmRSS (pre-step RSS), write "5" to
     /proc/self/clear_refs (resets VmHWM to the current RSS), run the step, read VmHWM (peak RSS).
     CUDA: reset_peak_memory_stats, memory_allocated before, max_memory_allocated after.
     ``peak_delta_bytes = peak_bytes - pre_bytes`` is the step's own memory (activations, grads,
     temporaries) on top of the model and the runtime;
  4. loss and gradient fingerprint of that step; the eager worker saves them to ``ref_path``,
     any other worker reports ``loss_rel_err = |l - l_eager| / |l_eager|`` and
     ``grad_rel_err = max over parameters of max|g - g_eager| / max|g_eager|``.
Mode "probe" runs the warm-up and the memory step only.

Result JSON: status ("ok", "error" or "oom"), reason (exception type and first message line),
the numbers above, ``warmup_time_s`` (includes compilation) and ``notes`` (warnings raised by
streamfx while compiling).
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import gc
import json
import os
import statistics
import sys
import time
import traceback
import warnings

from . import methods as methods_mod
from . import presets as presets_mod


def describe_exception(exc: BaseException) -> str:
    """``"Type: first line of message"``, looking through torch.compile's backend wrapper."""
    inner = getattr(exc, "inner_exception", None)
    if inner is not None:
        exc = inner
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    first = lines[0] if lines else ""
    text = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return text if len(text) <= 240 else text[:237] + "..."


def is_oom(exc: BaseException) -> bool:
    import torch

    seen = exc
    while seen is not None:
        if isinstance(seen, torch.OutOfMemoryError) or "out of memory" in str(seen).lower():
            return True
        seen = getattr(seen, "inner_exception", None) or seen.__cause__
    return False


# ---------------------------------------------------------------- memory probes

def _proc_status_bytes(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _libc():
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def fix_malloc_thresholds() -> None:
    """Make RSS track live memory; call before anything large is allocated.

    A fixed M_MMAP_THRESHOLD disables glibc's dynamic threshold, so every block of 128 KiB or more
    is mmapped and goes back to the OS when freed.  With the dynamic threshold, freed large blocks
    stay in the heap and are reused, and the RSS high-water mark then counts memory that is no
    longer live.  Every method runs under the same setting, timing included.
    """
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(-3, 128 * 1024)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 128 * 1024)  # M_TRIM_THRESHOLD


def default_malloc_steady_state() -> None:
    """glibc's default settings as a long-running process reaches them: its dynamic mmap threshold
    rises to the largest block freed, up to 32 MiB on 64-bit (``DEFAULT_MMAP_THRESHOLD_MAX``),
    the trim threshold to twice that; freed blocks below it stay in the heap and are reused
    without page faults. For timing after ``fix_malloc_thresholds`` has served a measurement."""
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD
        libc.mallopt(-1, 64 << 20)  # M_TRIM_THRESHOLD


def _malloc_trim() -> None:
    libc = _libc()
    if libc is not None and hasattr(libc, "malloc_trim"):
        libc.malloc_trim(0)


class MemoryMeter:
    """Peak memory of one region of code: RSS high-water mark on CPU, allocator peak on CUDA."""

    def __init__(self, device: str):
        self.device = device
        self.pre_bytes = self.peak_bytes = 0
        self.hwm_reset = True

    def __enter__(self):
        import torch

        gc.collect()
        if self.device == "cuda":
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            self.pre_bytes = torch.cuda.memory_allocated()
        else:
            _malloc_trim()
            self.pre_bytes = _proc_status_bytes("VmRSS")
            self.hwm_reset = _reset_hwm()
        return self

    def __exit__(self, *exc):
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated()
        else:
            self.peak_bytes = _proc_status_bytes("VmHWM")
        return False


def allocated_peak(fn) -> int:
    """Peak bytes of CPU tensors allocated while ``fn`` runs, above those live before it: the
    profiler's record of every allocation and free (the tensors alone, where RSS also counts the
    allocator's own memory)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events, todo = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        e = todo.pop()
        todo += e.children
        if e.tag == _EventType.Allocation and e.extra_fields.device.type == "cpu":
            events.append((e.start_time_ns, e.extra_fields.alloc_size))
    now = peak = 0
    for _, b in sorted(events):
        now += b
        peak = max(peak, now)
    return peak


# ---------------------------------------------------------------- gradients

_WRAPPER_PARTS = {"base_layer", "_orig_mod", "_checkpoint_wrapped_module"}


def canonical_name(name: str) -> str:
    """A parameter name without the path parts that wrappers add.

    Drops wrapper attributes (``base_layer``, ``_orig_mod``, ...) and collapses a repeated part
    (the reference StreamModel turns ``self_attn`` into ``self_attn.self_attn``), so that the
    gradients of a wrapped model line up with eager's.
    """
    parts = []
    for part in name.split("."):
        if part in _WRAPPER_PARTS or (parts and parts[-1] == part):
            continue
        parts.append(part)
    return ".".join(parts)


def grad_fingerprint(model, sample: int) -> dict:
    """canonical name -> float32 CPU copy of the gradient (a fixed strided sample above ``sample``)."""
    import torch

    out = {}
    for raw_name, param in model.named_parameters():
        name = canonical_name(raw_name)
        g = param.grad
        if g is None:
            out[name] = None
            continue
        flat = g.detach().reshape(-1)
        if flat.numel() > sample:
            idx = torch.linspace(0, flat.numel() - 1, sample, device=flat.device, dtype=torch.float64).long()
            flat = flat[idx]
        out[name] = flat.float().cpu().clone()
    return out


def compare_grads(grads: dict, ref: dict) -> tuple[float, str]:
    """(max over parameters of max|g - g_ref| / max|g_ref|, the worst parameter's name)."""
    worst, worst_name = 0.0, ""
    for name, g_ref in ref.items():
        g = grads.get(name)
        if g is None and g_ref is None:
            continue
        if g is None or g_ref is None or g.shape != g_ref.shape:
            return float("inf"), name
        scale = g_ref.abs().max().item()
        diff = (g - g_ref).abs().max().item()
        err = diff / scale if scale > 0 else diff
        if err != err:  # NaN
            return float("nan"), name
        if err > worst:
            worst, worst_name = err, name
    return worst, worst_name


# ---------------------------------------------------------------- the run

def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _streamfx_warning(w) -> bool:
    text = str(w.message).lower()
    return "streamfx" in (w.filename or "") or "streamfx" in text or "streambp" in text


def run(args: dict) -> dict:
    import torch

    mode = args.get("mode", "measure")
    device = args.get("device", "cpu")
    preset = presets_mod.get_preset(args["preset"])
    if args.get("layers"):  # the preset at another depth (streamfx.bench.depth)
        preset = dataclasses.replace(preset, num_hidden_layers=int(args["layers"]))
    seq, dtype, seed = int(args["seq"]), args.get("dtype", preset.dtype), int(args.get("seed", 0))
    result = {"mode": mode, "preset": preset.name, "method": args["method"], "seq": seq,
              "dtype": dtype, "device": device, "status": "error", "reason": "", "notes": []}

    if device == "cpu":
        fix_malloc_thresholds()
    if device == "cuda" and args.get("mem_cap_bytes"):
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, args["mem_cap_bytes"] / total))

    torch.manual_seed(seed)
    model = presets_mod.build_model(preset, dtype, device, seed=seed, max_seq=seq)
    input_ids, labels = presets_mod.make_batch(preset, seq, device, seed=seed)
    result["params"] = sum(p.numel() for p in model.parameters())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        step = methods_mod.prepare(args["method"], model, device,
                                   streambp_options=args.get("streambp_options"),
                                   reference_options=args.get("reference_options"), seq=seq,
                                   loss=args.get("loss", "model"))
        _sync(device)
        t0 = time.perf_counter()
        step(input_ids, labels)
        _sync(device)
        result["warmup_time_s"] = time.perf_counter() - t0
    notes = []
    for w in caught:
        if _streamfx_warning(w):
            line = str(w.message).strip().splitlines()[0] if str(w.message).strip() else ""
            if line and line not in notes:
                notes.append(line[:300])
    result["notes"] = notes
    model.zero_grad(set_to_none=True)

    if mode == "measure" and int(args.get("repeats", 3)) > 0:
        times, cpu = [], []
        for _ in range(int(args.get("repeats", 3))):
            model.zero_grad(set_to_none=True)
            _sync(device)
            t0, c0 = time.perf_counter(), time.process_time()
            step(input_ids, labels)
            _sync(device)
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
        result["step_times_s"] = times
        result["median_time_s"] = statistics.median(times)
        result["median_cpu_time_s"] = statistics.median(cpu)
        model.zero_grad(set_to_none=True)
    if args.get("keep_grads"):  # the gradients exist before the memory step: its rise is what the step keeps
        step(input_ids, labels)
        model.zero_grad(set_to_none=False)

    with MemoryMeter(device) as meter:
        loss = step(input_ids, labels)
    result.update(pre_bytes=meter.pre_bytes, peak_bytes=meter.peak_bytes,
                  peak_delta_bytes=meter.peak_bytes - meter.pre_bytes, hwm_reset=meter.hwm_reset)
    result["loss"] = float(loss.float().item())
    if mode == "measure":
        _compare_with_eager(args, model, result)
    result["status"] = "ok"
    return result


def _compare_with_eager(args: dict, model, result: dict) -> None:
    import torch

    ref_path = args.get("ref_path")
    grads = grad_fingerprint(model, int(args.get("grad_sample", 1 << 18)))
    if args["method"] == "eager":
        if ref_path:
            os.makedirs(os.path.dirname(ref_path) or ".", exist_ok=True)
            torch.save({"loss": result["loss"], "grads": grads}, ref_path)
        result["loss_rel_err"] = 0.0
        result["grad_rel_err"] = 0.0
        return
    if not ref_path or not os.path.exists(ref_path):
        result["loss_rel_err"] = result["grad_rel_err"] = None
        return
    ref = torch.load(ref_path, weights_only=True)
    ref_loss = ref["loss"]
    result["loss_rel_err"] = abs(result["loss"] - ref_loss) / abs(ref_loss) if ref_loss else abs(result["loss"])
    err, name = compare_grads(grads, ref["grads"])
    result["grad_rel_err"] = err
    result["grad_worst_param"] = name


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m streamfx.bench.worker", description=__doc__.split("\n")[0])
    parser.add_argument("--json-args", required=True, help="the measurement, as a JSON object")
    ns = parser.parse_args(argv)
    args = json.loads(ns.json_args)
    try:
        result = run(args)
    except BaseException as exc:  # noqa: BLE001 - every failure becomes the row's reason
        if isinstance(exc, KeyboardInterrupt):
            raise
        oom = False
        try:
            oom = is_oom(exc)
        except Exception:  # noqa: BLE001
            pass
        result = {"preset": args.get("preset"), "method": args.get("method"), "seq": args.get("seq"),
                  "mode": args.get("mode", "measure"), "status": "oom" if oom else "error",
                  "reason": describe_exception(exc), "traceback": traceback.format_exc()[-4000:]}
    path = args.get("result_path")
    text = json.dumps(result)
    if path:
        with open(path, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
