"""The benchmark harness end to end on the tiny preset, plus its pure helpers."""
import json
import math

import pytest

pytest.importorskip("transformers")
pytest.importorskip("matplotlib")

from streamfx.bench import cli, runner  # noqa: E402
from streamfx.bench.methods import not_applicable, parse_methods  # noqa: E402
from streamfx.bench.presets import PRESETS  # noqa: E402
from streamfx.bench.summary import least_squares_slope  # noqa: E402

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
METHODS = ["eager", "ckpt", "streambp-eager"]
# one worker runs the tests of the tiny run under pytest-xdist (--dist loadgroup): its fixture runs once
TINY_RUN = pytest.mark.xdist_group("bench")


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    rc = cli.main(["--model", "tiny", "--seq", "32,64", "--methods", ",".join(METHODS + ["liger"]),
                   "--repeats", "1", "--device", "cpu", "--timeout", "300", "--out", str(out)])
    assert rc == 0
    return out


@TINY_RUN
def test_outputs_exist(tiny_run):
    for name in ("results.md", "results.json", "results.csv", "memory.png"):
        assert (tiny_run / name).is_file(), name
    assert (tiny_run / "memory.png").read_bytes()[:8] == PNG_MAGIC


@TINY_RUN
def test_markdown_has_a_row_per_method(tiny_run):
    md = (tiny_run / "results.md").read_text()
    rows = {}  # first table: one row per method
    for line in md.splitlines():
        if line.startswith("| "):
            rows.setdefault(line.split("|")[1].strip(), line)
    for method in METHODS + ["liger"]:
        assert method in rows, method
    for method in ("eager", "ckpt"):
        assert rows[method].rstrip(" |").endswith("ok"), rows[method]
    # streambp-eager: numbers, or the reason it failed
    sb = [c.strip() for c in rows["streambp-eager"].split("|")[1:-1]]
    assert sb[-1] == "ok" or sb[-1] not in ("", "—"), sb
    assert "needs CUDA" in rows["liger"]
    assert "torch" in md and "transformers" in md and "cores" in md


@TINY_RUN
def test_json_fields(tiny_run):
    doc = json.loads((tiny_run / "results.json").read_text())
    assert {"meta", "config", "summary", "runs", "max_len"} <= set(doc)
    assert doc["config"]["device"] == "cpu"
    runs = doc["runs"]
    assert {(r["method"], r["seq"]) for r in runs} == {(m, s) for m in METHODS + ["liger"] for s in (32, 64)}
    for r in runs:
        assert r["status"] in ("ok", "error", "oom", "timeout", "crashed", "skipped")
        if r["status"] == "ok":
            assert r["peak_bytes"] >= r["pre_bytes"] > 0
            assert r["peak_delta_bytes"] == r["peak_bytes"] - r["pre_bytes"]
            assert r["median_time_s"] > 0 and math.isfinite(r["loss"])
        else:
            assert r["reason"]
    eager = [r for r in runs if r["method"] == "eager"]
    assert all(r["status"] == "ok" for r in eager)
    ckpt = [r for r in runs if r["method"] == "ckpt"]
    assert all(r["status"] == "ok" and r["loss_rel_err"] < 1e-5 and r["grad_rel_err"] < 1e-4 for r in ckpt)
    rows = {r["method"]: r for r in doc["summary"]["tiny"]["rows"]}
    assert rows["eager"]["bytes_per_token"] is not None
    assert rows["ckpt"]["mem_vs_ckpt"] == pytest.approx(1.0)
    assert rows["liger"]["status"] == "needs CUDA"


@TINY_RUN
def test_csv_has_a_line_per_run(tiny_run):
    lines = (tiny_run / "results.csv").read_text().strip().splitlines()
    assert lines[0].startswith("preset,method,seq")
    assert len(lines) == 1 + 2 * (len(METHODS) + 1)


@pytest.mark.fast
def test_helpers():
    assert least_squares_slope([(1, 3.0), (2, 5.0), (3, 7.0)]) == pytest.approx(2.0)
    assert least_squares_slope([(1, 3.0)]) is None
    assert parse_methods("eager, streambp") == ["eager", "streambp"]
    with pytest.raises(ValueError):
        parse_methods("eager,nope")
    assert not_applicable("liger", "cpu", None) == "needs CUDA"
    assert "not installed" in not_applicable("reference", "cpu", None)
    assert not_applicable("streambp", "cpu", None) is None
    for name in ("tiny", "qwen3-head", "qwen3-layers", "qwen3-0.6b", "qwen3-4b", "qwen3-8b"):
        assert name in PRESETS
    assert PRESETS["qwen3-8b"].vocab_size == 151936


@pytest.mark.fast
def test_max_len_bisection(tmp_path, monkeypatch):
    limit = 50_000
    seen = []

    def fake_worker(cfg, args, log_name):
        seen.append(args["seq"])
        ok = args["seq"] <= limit
        return {"status": "ok" if ok else "oom", "reason": "" if ok else "OutOfMemoryError: CUDA out of memory"}

    monkeypatch.setattr(runner, "run_worker", fake_worker)
    cfg = runner.BenchConfig(presets=["tiny"], methods=["ckpt"], out_dir=tmp_path, device="cuda",
                             max_len_start=4096, max_len_step=512)
    result = runner._bisect(cfg, "tiny", "ckpt")
    assert result["status"] == "ok"
    assert result["max_len"] <= limit < result["first_failure"]
    assert result["first_failure"] - result["max_len"] <= max(512, result["max_len"] // 16)
    assert len(seen) <= cfg.max_len_probes
    cpu = runner.run_max_len(runner.BenchConfig(presets=["tiny"], methods=[], out_dir=tmp_path, device="cpu"))
    assert {r["reason"] for r in cpu} == {"needs CUDA"}


@pytest.mark.fast
def test_shifted_loss_equals_the_model_loss():
    """--loss shifted computes cross_entropy(logits[:, :-1], labels[:, 1:]) outside the model:
    the same value and gradients as the model's own (label-shifting) loss; unknown losses raise."""
    import torch

    from streamfx.bench import methods, presets

    preset = PRESETS["tiny"]
    ids, labels = presets.make_batch(preset, 32, "cpu", seed=0)
    results = []
    for loss in methods.LOSSES:
        model = presets.build_model(preset, "float32", "cpu", seed=0, max_seq=32)
        step = methods.prepare("eager", model, "cpu", loss=loss)
        results.append((step(ids, labels), {n: p.grad.clone() for n, p in model.named_parameters()}))
    (loss_model, g_model), (loss_shift, g_shift) = results
    torch.testing.assert_close(loss_shift, loss_model, rtol=1e-6, atol=1e-6)
    for name, g in g_model.items():
        torch.testing.assert_close(g_shift[name], g, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="known"):
        methods.prepare("eager", model, "cpu", loss="mean")


@pytest.mark.slow
@pytest.mark.extended   # (FSDP2 itself streams in test_distributed.py; this is the benchmark's table)
def test_fsdp_memory_per_rank(tmp_path):
    """The FSDP2 memory benchmark on 2 ranks (tiny preset): every rank measured, streambp's layers
    and head streamed, its gradient shards equal eager's."""
    from streamfx.bench import fsdp

    rows = fsdp.run("tiny", 64, ["eager", "streambp"], 2, "cpu", "float32", str(tmp_path), {"chunk_size": 16})
    assert [(r["method"], r["rank"], r["status"]) for r in rows] == [
        ("eager", 0, "ok"), ("eager", 1, "ok"), ("streambp", 0, "ok"), ("streambp", 1, "ok")], rows
    preset = PRESETS["tiny"]
    for r in rows:
        assert r["peak_bytes"] >= r["pre_bytes"] > 0
        if r["method"] == "streambp":
            assert r["streamed_regions"] == preset.num_hidden_layers + 1, r   # every layer and the head
            assert r["grad_rel_err"] <= 1e-5, r
    assert "| streambp | 1 |" in fsdp.table(rows, "tiny", 64)


@pytest.mark.fast
def test_gpu_command_takes_a_part_budget_from_the_command_line(tmp_path, monkeypatch, capsys):
    """``--budget PART=SECONDS`` replaces that part's planned budget (a lent machine's time
    differs from the plan's); another part keeps the plan's; a wrong part or number is refused
    with the parts allowed."""
    import time

    from streamfx.bench import gpu

    left = {}
    monkeypatch.setattr(gpu, "_run", lambda name, setup, state: left.setdefault(name, setup.deadline - time.monotonic()) and [])
    assert gpu.main(["--device", "cpu", "--parts", "kernels,offload", "--budget", "offload=300",
                     "--out", str(tmp_path)]) == 0
    planned = {p.name: p.budget_s for p in gpu.PLAN}
    assert planned["kernels"] - 5 < left["kernels"] <= planned["kernels"]
    assert 295 < left["offload"] <= 300 != planned["offload"]
    for bad in ("speeed=10", "offload=soon"):
        with pytest.raises(SystemExit):
            gpu.main(["--device", "cpu", "--budget", bad, "--out", str(tmp_path)])
        assert "PART one of ['kernels', 'offload', 'memory', 'max_len', 'speed']" in capsys.readouterr().err


@pytest.mark.fast
def test_gpu_command_compiles_its_methods_with_the_mode_asked_for(tmp_path, monkeypatch, capsys):
    """``--mode``: the memory, max_len and speed parts compile streamfx (its options) and
    checkpointing under torch.compile with that mode; a mode streamfx refuses, or any mode with
    ``--tiny`` (its graphs run as FX graphs), ends the command before anything runs."""
    import torch

    from streamfx.bench import gpu, gpu_parts, methods

    setups = []
    monkeypatch.setattr(gpu, "_run", lambda name, setup, state: setups.append(setup) or [])
    assert gpu.main(["--device", "cpu", "--parts", "speed", "--mode", "max-autotune-no-cudagraphs",
                     "--out", str(tmp_path)]) == 0
    setup = setups[0]
    assert setup.mode == "max-autotune-no-cudagraphs" and "mode" not in setup.streamfx_options
    compiles = []
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: compiles.append(kwargs) or model)
    for method in ("streamfx", "ckpt+compile"):
        gpu_parts.stepper(method, torch.nn.Linear(2, 2), setup)
    assert compiles[0]["options"]["mode"] == compiles[1]["mode"] == "max-autotune-no-cudagraphs", compiles
    assert compiles[0]["backend"] == methods._streambp_backend() and "mode" not in compiles[0], compiles
    for bad, says in ((["--mode", "max-autotune"], "CUDA graphs"), (["--mode", "lite", "--tiny"], "--tiny")):
        with pytest.raises(SystemExit):
            gpu.main(["--device", "cpu", "--parts", "speed", *bad, "--out", str(tmp_path)])
        assert says in capsys.readouterr().err


@pytest.mark.fast
def test_gpu_longest_length_search_makes_no_probe_that_outlasts_its_time():
    """The GPU command's longest-length search on a device with far more memory than the measured
    lengths use (an H200's 139 GiB against four lengths up to 32k): the memory fit guesses a length
    whose one step would take far longer than the part's time. The step times measured before
    (a fit of b T + c T^2) shorten the probe to one that ends in time; the search stops, saying
    why, when no longer probe would. Without them the first probe runs past the budget."""
    from streamfx.bench import gpu_parts

    clock = [0.0]
    seconds = lambda n: 2e-8 * n * n + 1e-5 * n          # noqa: E731 - a 36-layer 8B step's shape
    reserved = lambda n: (1 << 30) + n * (1 << 20)       # noqa: E731 - fits up to ~200k in the cap

    def step_at(step, preset, seq, setup):
        clock[0] += seconds(seq)
        return {"seq": seq, "status": "ok", "seconds": seconds(seq), "reserved": reserved(seq)}

    class Clock:
        monotonic = staticmethod(lambda: clock[0])

    setup = gpu_parts.Setup(device="cpu", kernel_preset="", kernel_seq=0, memory_preset="", memory_seqs=(4096, 32768),
                            speed_preset="", speed_seq=0, speed_repeats=1, max_len_step=2048,
                            max_len_limit=262144, mem_cap_bytes=None, streamfx_options={}, compile_backend="",
                            deadline=120.0)
    measured = [(n, seconds(n)) for n in (4096, 8192, 16384, 32768)]
    fit = gpu_parts._linear_fit([(n, reserved(n)) for n, _ in measured])
    cap = reserved(200_000)

    def search(times=()):
        clock[0] = 0.0
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(gpu_parts, "measured_step", step_at)
            mp.setattr(gpu_parts, "time", Clock)
            return gpu_parts._bisect(None, None, fit, 32768, cap, setup, times=times)

    row = search(measured)
    assert clock[0] <= setup.deadline, (clock[0], row)
    assert row["max_len"] >= 65536 and row["first_failure"] is None, row
    assert "would take about" in row["reason"], row
    # no step times: the first probe at the memory fit's guess outlasts the part's time
    row = search()
    assert clock[0] > setup.deadline and row["probes"][0][0] >= 190_000, row


@pytest.mark.fast
def test_gpu_kernel_rows_tell_a_model_torch_compile_cannot_trace_from_a_streamfx_failure():
    """A kernel row whose streamfx compile fails is "unavailable" only where torch.compile fails
    without streamfx too (Hugging Face's 4-D mask under compile given to a flash-only SDPA: the
    fake-tensor call fails in Dynamo, before any backend): ``_dynamo_alone_fails`` compiles the
    model with ``aot_eager`` and gives the reason, or "" where it runs."""
    import torch
    from torch.nn.attention import SDPBackend

    from streamfx.bench import gpu_parts

    @torch.library.custom_op("streamfx_test::twice_without_fake", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    class Out:
        def __init__(self, loss):
            self.loss = loss

    class Model(torch.nn.Module):
        def __init__(self, custom):
            super().__init__()
            self.w, self.custom = torch.nn.Parameter(torch.ones(3)), custom

        def forward(self, input_ids=None, labels=None, use_cache=False):
            x = self.w * input_ids.float().sum()
            return Out((twice(x) if self.custom else x * 2).sum())

    ids = torch.ones(2, 3)
    assert gpu_parts._dynamo_alone_fails(Model(False), ids, None, SDPBackend.MATH) == ""
    reason = gpu_parts._dynamo_alone_fails(Model(True), ids, None, SDPBackend.MATH)
    assert reason.startswith("torch.compile without streamfx fails too") and "fake tensor" in reason, reason
    torch._dynamo.reset()


@pytest.mark.slow
def test_gpu_command_tiny_on_cpu(tmp_path):
    """``python -m streamfx.bench gpu --device cpu --tiny``: every part runs (the GPU command's code
    paths on tiny shapes) and writes its table, JSON and plot; the kernel the CPU has streams with
    the gradients of eager, and the longest-length search probes without a compile per probe."""
    import json
    import subprocess
    import sys

    out = tmp_path / "gpu"
    proc = subprocess.run([sys.executable, "-m", "streamfx.bench", "gpu", "--device", "cpu", "--tiny",
                           "--deadline", "1500", "--out", str(out)], capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {p.name for p in out.iterdir()} >= {"gpu.md", "gpu.json", "gpu.png"}
    parts = json.loads((out / "gpu.json").read_text())["parts"]
    assert set(parts) == {"kernels", "offload", "memory", "plan", "max_len", "speed"}
    flash = [r for r in parts["kernels"]["rows"] if r["kernel"] == "flash"]
    assert [(r["model"], r["status"]) for r in flash] == [(m, "ok") for m in ("hf", "hf", "plain", "plain")], flash
    assert all(r["streamed"] for r in flash), flash
    for r in flash:
        if r["dtype"] == "float32":
            assert r["grad_error"] <= 1e-4, r
    offload = parts["offload"]["rows"]
    assert len(offload) == 4 and all(r["status"] == "ok" and r["streamed"] and r["grad_error"] <= 1e-4
                                     for r in offload), offload
    assert [r["moved"]["inputs_offloaded"] > 0 for r in offload] == [False, True, False, True], offload
    assert [r["moved"]["inputs_rebuilt"] > 0 for r in offload] == [False, False, True, True], offload
    for name in ("memory", "speed"):
        assert all(r["status"] == "ok" for r in parts[name]["rows"]), parts[name]["rows"]
    assert len(parts["memory"]["rows"]) == 3 * 4
    # each method's first step (the compile) is timed beside its first length, and did not fail
    assert [r["seq"] for r in parts["memory"]["rows"] if r.get("first_seconds") is not None] == [32] * 3
    assert not any("first step" in (r.get("reason") or "") for r in parts["memory"]["rows"])
    # a layer's backward chunks ran as one compiled graph each, none fell back to the training compile
    assert all(r["vjp"].endswith("/0") for name in ("memory", "speed") for r in parts[name]["rows"]
               if r.get("vjp")), [r.get("vjp") for r in parts["memory"]["rows"] + parts["speed"]["rows"]]
    # after the warm-up step nothing compiles again, at any length (dynamic shapes)
    assert all(r["compiled"] == "0+0" for r in parts["memory"]["rows"]), parts["memory"]["rows"]
    plan = parts["plan"]["rows"]
    steps = [r for r in plan if r.get("quantity") == "step peak rise GiB"]
    assert {(r["method"], r["seq"]) for r in steps} == {(m, t) for m in ("streamfx", "ckpt") for t in (32, 64, 96, 128)}
    assert all(r["predicted"] > 0 for r in steps), steps
    assert {r["method"] for r in plan if r.get("quantity") == "longest T"} == {"streamfx", "ckpt"}, plan
    for r in parts["max_len"]["rows"]:
        assert r["status"] == "ok" and r["max_len"] >= 128 and r["compiles"] == "0+0", r
    md = (out / "gpu.md").read_text()
    assert "## kernels" in md and "## speed" in md and "| streamfx |" in md


@pytest.mark.slow
@pytest.mark.extended   # (a profiling aid for GPU sessions; the GPU command itself runs in the default run)
def test_gpu_profile_on_cpu(tmp_path):
    """``python -m streamfx.bench.gpu_profile``: per method and length a first step, a measured
    step, and the Python and op profiles of one more, written to profile.md."""
    import subprocess
    import sys

    out = tmp_path / "profile"
    proc = subprocess.run([sys.executable, "-m", "streamfx.bench.gpu_profile", "--preset", "tiny", "--layers", "2",
                           "--seqs", "32,64", "--methods", "streamfx,ckpt", "--device", "cpu", "--rows", "5",
                           "--out", str(out)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    md = (out / "profile.md").read_text()
    rows = [line.split("|")[1:-1] for line in md.splitlines() if line.startswith("| streamfx") or line.startswith("| ckpt")]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("streamfx", "32"), ("ckpt", "32"), ("streamfx", "64"),
                                                            ("ckpt", "64")], md[:2000]
    for r in rows:
        float(r[2]), float(r[3])   # (a first step that failed would say so here)
    streamfx_rows = [r for r in rows if r[0].strip() == "streamfx"]
    assert all(r[4].strip() == "0+0" and int(r[5].split("/")[0]) > 0 for r in streamfx_rows[1:]), streamfx_rows
    assert md.count("Python (cProfile)") == 4 and md.count("ops (torch.profiler)") == 4
    # the ops split by their inputs' shapes: a table per step, with the shapes in it
    assert md.count("by self_cpu_time_total, per input shapes") == 4 and "Input Shapes" in md
    assert "aten::mm" in md.split("per input shapes")[1] and "[[" in md.split("per input shapes")[1]


@pytest.mark.fast
def test_speed_table_medians_and_ratios():
    """``bench.speed``'s table: per method the median over rounds, its ratio to each baseline's
    median, the streambp split with what ran outside the regions, a failed method's reason."""
    from streamfx.bench import speed

    def row(method, t, r, split=None):
        return {"preset": "p", "seq": 64, "method": method, "time_s": t, "rss_rise_bytes": 2**20, "round": r,
                "split_s": split or {}}

    rows = [row("streambp", 0.9, 0, {"head forward": 0.2, "layer backward": 0.4}),
            row("streambp", 1.1, 1, {"head forward": 0.2, "layer backward": 0.4}),
            row("streambp", 0.8, 2, {"head forward": 0.2, "layer backward": 0.4}),
            row("ckpt", 1.0, 0), row("ckpt", 1.2, 1), row("ckpt", 0.95, 2),
            {"preset": "p", "seq": 64, "method": "ckpt-compiled", "error": "boom"}]
    text = speed.table(rows, ["streambp", "ckpt", "ckpt-compiled"])
    assert "| p | 64 | streambp | 0.900 | 3 | 0.900 | - | 1 | head forward 0.20, layer backward 0.40; " \
           "outside regions 0.30 |" in text, text
    assert "| p | 64 | ckpt | 1.000 | 3 | - | - | 1 | - |" in text, text
    assert "| p | 64 | ckpt-compiled | failed: boom |" in text, text


@pytest.mark.fast
def test_speed_command_refuses_an_unknown_preset_or_method_before_running_anything(tmp_path, capsys):
    """``bench.speed`` names the allowed presets and methods and starts no process for a typo."""
    from streamfx.bench import speed

    for argv, allowed in ((["--preset", "layers"], "'qwen3-layers'"), (["--methods", "streambp,chkpt"], "'ckpt'")):
        with pytest.raises(SystemExit):
            speed.main(argv + ["--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert "unknown" in err and allowed in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.fast
def test_hf_checkpointing_switches_every_layer_without_a_deprecation_warning():
    """The benchmarks' checkpointing baseline: every decoder layer checkpointed, through the name
    the installed transformers has (no FutureWarning from a deprecated alias), and off again."""
    import warnings

    import zoo
    from streamfx.bench.methods import hf_checkpointing

    model, _ = zoo.qwen3_sdpa()
    layers = [m for m in model.modules() if hasattr(m, "gradient_checkpointing")]
    assert layers
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        hf_checkpointing(model)
        assert all(m.gradient_checkpointing for m in layers)
        hf_checkpointing(model, on=False)
        assert not any(m.gradient_checkpointing for m in layers)


def test_compiled_checkpointing_baseline_is_one_graph_at_every_length():
    """The ``ckpt-compiled`` / ``ckpt+compile`` baseline: the zoo's Qwen3 under Hugging Face
    checkpointing and torch.compile(dynamic=True) is one graph, with no recompile at a second
    length, and gives eager checkpointing's gradients. (transformers >= 5.25 layers set and reset
    the `kernels` package's routing variable in their forward, a side effect Dynamo's checkpoint
    operator refuses by default: without ``compile_checkpointed``'s flag each layer breaks the
    graph.)"""
    import copy

    import torch
    from torch._dynamo.utils import counters

    import zoo
    from streamfx.bench.methods import compile_checkpointed, hf_checkpointing

    net, _ = zoo.qwen3_sdpa()
    hf_checkpointing(net)
    ref = copy.deepcopy(net)
    torch._dynamo.reset()
    counters.clear()
    step = compile_checkpointed(net, backend="aot_eager", dynamic=True)
    for T in (12, 20):
        ids = torch.randint(1, zoo.VOCAB, (1, T), generator=torch.Generator().manual_seed(T))
        for m, call in ((net, step), (ref, ref)):
            m.zero_grad(set_to_none=True)
            call(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        for (name, p), q in zip(net.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
    assert not counters["graph_break"], dict(counters["graph_break"])
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
