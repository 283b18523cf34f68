"""Writes the benchmark's outputs into the output directory.

Contract (:func:`write_all`):
  * ``results.md``  header (machine, versions, dtype, presets, protocol), then per preset one
    markdown table with a row per method: step peak memory per length, bytes/token slope and its
    ratio to ckpt, median step time per length and its ratio to ckpt, loss and gradient relative
    error against eager, and the status or why the method failed / did not apply; a table of
    absolute peaks; the maximum-length table when it was measured.
  * ``results.json`` ``{"meta", "config", "summary", "runs", "max_len"}`` with every raw run.
  * ``results.csv``  one line per raw run (columns :data:`CSV_FIELDS`).
  * ``memory.png``   step peak memory against sequence length, a line per method and the floor
    dashed (one gradient copy of the parameters plus (layers + 1) * d * dtype_bytes per token:
    what any exact BP step must hold), one panel per preset.
"""
from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from .methods import METHODS
from .presets import DTYPE_BYTES, get_preset

MiB = 1 << 20
GiB = 1 << 30

CSV_FIELDS = ["preset", "method", "seq", "dtype", "device", "status", "reason", "peak_bytes", "pre_bytes",
              "peak_delta_bytes", "median_time_s", "warmup_time_s", "step_times_s", "loss", "loss_rel_err",
              "grad_rel_err", "grad_worst_param", "params", "hwm_reset", "notes", "wall_s", "log"]


def _mib(v) -> str:
    return "—" if v is None else f"{v / MiB:.1f}"


def _num(v, fmt) -> str:
    if v is None:
        return "—"
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return str(v)
    return format(v, fmt)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _preset_line(name: str, dtype: str, params: int | None) -> str:
    p = get_preset(name)
    params_txt = f", {params / 1e6:.2f} M params" if params else ""
    return (f"Qwen3-shaped: V={p.vocab_size}, d={p.hidden_size}, ffn={p.intermediate_size}, "
            f"{p.num_hidden_layers} layers, {p.num_attention_heads} heads / {p.num_key_value_heads} kv heads, "
            f"head_dim {p.head_dim}, tied embeddings {'yes' if p.tie_word_embeddings else 'no'}, "
            f"{dtype}{params_txt}. {p.note}")


def render_markdown(meta: dict, config: dict, summaries: dict, runs: list[dict], max_len: list[dict]) -> str:
    m = meta["machine"]
    ram = f"{m['ram_bytes'] / GiB:.1f} GiB RAM" if m.get("ram_bytes") else "RAM unknown"
    lines = ["# streamfx benchmark", ""]
    lines.append(f"- machine: {m['cpu']}, {m['cores']} cores, {ram}"
                 + (f"; GPU {m['gpu']} ({m['gpu_memory_bytes'] / GiB:.1f} GiB), CUDA {m.get('cuda')}"
                    if m.get("gpu") else ""))
    lines.append(f"- versions: torch {m['torch']}, transformers {m['transformers']}, python {m['python']}")
    lines.append(f"- device: {config['device']}; dtype: {', '.join(sorted(set(config['dtypes'].values())))}; "
                 f"presets: {', '.join(config['presets'])}; repeats: {config['repeats']}")
    lines.append(f"- date: {meta['date']}; command: `{meta['command']}`")
    lines.append("")
    memory_kind = ("peak RSS (VmHWM after clear_refs) minus the RSS before the step; glibc's mmap "
                   "threshold is fixed at 128 KiB so that freed blocks leave the RSS" if config["device"] == "cpu"
                   else "torch.cuda.max_memory_allocated minus memory_allocated before the step")
    loss_kind = ("the loss computed outside the model on the returned logits, "
                 "cross_entropy(logits[:, :-1], labels[:, 1:]), " if config.get("loss") == "shifted" else "")
    lines.append(f"One BP step = forward with labels (first quarter of the labels is -100), {loss_kind}"
                 "+ loss.backward(), "
                 "batch 1, train mode, use_cache=False, each measurement in a fresh process after one "
                 f"warm-up step. **peak** (MiB) = {memory_kind}. **B/token** = least-squares slope of peak "
                 "over the lengths; the floor is (layers+1)·d·dtype_bytes. **time** = median step time, s. "
                 "Ratios are against ckpt (time at the longest length both ran). Errors are relative to "
                 "eager: |loss−loss_eager|/|loss_eager| and max over parameters of "
                 "max|g−g_eager|/max|g_eager|.")
    lines.append("")
    for preset, info in summaries.items():
        seqs, rows, dtype = info["seqs"], info["rows"], info["dtype"]
        floor = get_preset(preset).floor_bytes_per_token(DTYPE_BYTES[dtype])
        grads = (info.get("params") or 0) * DTYPE_BYTES[dtype]
        lines += [f"## {preset}", "", _preset_line(preset, dtype, info.get("params")),
                  f"Floor: {floor} B/token (the step peak also holds the gradients, {_mib(grads)} MiB).", ""]
        head = (["method"] + [f"peak T={s}" for s in seqs] + ["B/token", "vs ckpt"]
                + [f"time T={s}" for s in seqs] + ["time vs ckpt", "loss err", "grad err", "status"])
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + "|".join(["---"] + ["---:"] * (len(head) - 2) + ["---"]) + "|")
        for r in rows:
            cells = ([r["method"]] + [_mib(r["peak_delta"][s]) for s in seqs]
                     + [_num(r["bytes_per_token"], ".0f"), _num(r["mem_vs_ckpt"], ".2f")]
                     + [_num(r["time"][s], ".3f") for s in seqs]
                     + [_num(r["time_vs_ckpt"], ".2f"), _num(r["loss_rel_err"], ".1e"),
                        _num(r["grad_rel_err"], ".1e"), _cell(r["status"])])
            lines.append("| " + " | ".join(cells) + " |")
        lines += ["", f"Absolute peak ({'RSS' if config['device'] == 'cpu' else 'allocated'}, MiB):", ""]
        lines.append("| method | " + " | ".join(f"T={s}" for s in seqs) + " |")
        lines.append("|---|" + "|".join("---:" for _ in seqs) + "|")
        for r in rows:
            if r["ok"]:
                lines.append(f"| {r['method']} | " + " | ".join(_mib(r["peak"][s]) for s in seqs) + " |")
        lines.append("")
    if max_len:
        lines += ["## Maximum sequence length", "",
                  "| preset | method | max length | first failing length | cap | status |", "|---|---|---:|---:|---:|---|"]
        for r in max_len:
            cap = "device memory" if not r.get("cap_bytes") else f"{r['cap_bytes'] / GiB:.1f} GiB"
            lines.append(f"| {r['preset']} | {r['method']} | {r.get('max_len') or '—'} | "
                         f"{r.get('first_failure') or '—'} | {cap} | {_cell(r.get('reason') or r['status'])} |")
        lines.append("")
    lines += ["## Methods", ""] + [f"- **{name}**: {METHODS[name].description}" for name in config["methods"]]
    return "\n".join(lines) + "\n"


def write_csv(path: Path, runs: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for run in runs:
            row = dict(run)
            row["notes"] = " | ".join(run.get("notes") or [])
            if run.get("step_times_s") is not None:
                row["step_times_s"] = " ".join(f"{t:.6f}" for t in run["step_times_s"])
            writer.writerow(row)


def plot_memory(path: Path, summaries: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = max(1, len(summaries))
    fig, axes = plt.subplots(1, n, figsize=(6.5 * n, 4.8), squeeze=False)
    for ax, (preset, info) in zip(axes[0], summaries.items()):
        seqs = info["seqs"]
        drawn = False
        for r in info["rows"]:
            pts = [(s, r["peak_delta"][s] / MiB) for s in seqs if r["peak_delta"][s] is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=r["method"])
                drawn = True
        dtype_bytes = DTYPE_BYTES[info["dtype"]]
        floor = get_preset(preset).floor_bytes_per_token(dtype_bytes)
        grads = (info.get("params") or 0) * dtype_bytes
        xs = list(seqs)
        ax.plot(xs, [(grads + floor * x) / MiB for x in xs], "k--",
                label="floor: grads + (L+1)·d·bytes per token" if grads else "floor: (L+1)·d·bytes per token")
        if not drawn:
            ax.text(0.5, 0.5, "no successful runs", transform=ax.transAxes, ha="center")
        ax.set_title(f"{preset} ({info['dtype']})")
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("step peak memory (MiB)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, float) and (math.isnan(obj) or math.isinf(obj)):
        return str(obj)
    if isinstance(obj, Path):
        return str(obj)
    return obj


def write_all(out_dir: Path, meta: dict, config: dict, summaries: dict, runs: list[dict],
              max_len: list[dict]) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {name: out_dir / name for name in ("results.md", "results.json", "results.csv", "memory.png")}
    paths["results.md"].write_text(render_markdown(meta, config, summaries, runs, max_len))
    doc = {"meta": meta, "config": config,
           "summary": {p: {"seqs": s["seqs"], "dtype": s["dtype"], "rows": s["rows"]} for p, s in summaries.items()},
           "runs": runs, "max_len": max_len}
    paths["results.json"].write_text(json.dumps(_jsonable(doc), indent=1))
    write_csv(paths["results.csv"], runs)
    plot_memory(paths["memory.png"], summaries)
    return paths
