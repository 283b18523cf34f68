"""Distributed training on 2 CPU ranks (gloo), each test launching its own processes.

Each rank computes its half of a global batch through ``torch.compile(backend="streambp")``
under DDP or FSDP2; the gradients after one step must equal single-process eager autograd's over
the global batch, every layer and the head must have streamed (runtime counters), and under DDP
each parameter's gradient is reduced once per step (a comm hook counts the parameters of every
bucket it reduces).
"""
import faulthandler
import os
import sys
import tempfile
import time
import warnings

import pytest
import torch
import torch.multiprocessing as mp

import zoo
from conftest import assert_grads_match, counting_allreduce

WORLD = 2
TIMEOUT_S = 240
OPTIONS = {"codegen": "eager", "chunk_size": 8, "head_chunk_size": 8}
CASE = zoo.Case("dist", 2, 24)          # the global batch: one row per rank


def init_ranks(rank, rendezvous):
    """Sets up a rank's process (its rank in the environment, one thread, the checks of
    ``STREAMFX_VERIFY``, the tests' modules importable) and joins the 2 ranks' gloo group through a
    file store in the test's own directory: no port to choose, so tests launched at once
    (pytest-xdist workers) cannot race for one; gloo's own connections bind ports the system picks."""
    import torch.distributed as dist

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1", STREAMFX_VERIFY="1")
    sys.path.insert(0, os.path.dirname(__file__))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=rendezvous, rank=rank, world_size=WORLD)


def _worker(rank, rendezvous, mode, out):
    import torch.distributed as dist

    from streamfx.runtime import COUNTERS

    init_ranks(rank, rendezvous)
    try:
        model, make_inputs = zoo.tiny_llama()
        ids, labels = make_inputs(CASE).args
        ids, labels = ids[rank:rank + 1], labels[rank:rank + 1]
        reduced = []
        if mode.startswith("ddp"):
            from torch.nn.parallel import DistributedDataParallel as DDP

            names = {p: n for n, p in model.named_parameters()}
            bucket = {"ddp": 25, "ddp_inner": 25, "ddp_small_bucket": 0.005}[mode]
            # DDPOptimizer asserts its first bucket (1 MiB by default) is no larger than the others;
            # DDP itself uses ``bucket_cap_mb`` for every bucket when it is given
            dist._DEFAULT_FIRST_BUCKET_BYTES = min(dist._DEFAULT_FIRST_BUCKET_BYTES, int(bucket * 1024 * 1024))
            if mode == "ddp_inner":  # the other wrap order: DDP around the compiled model
                wrapped = run = DDP(torch.compile(model, backend="streambp", options=OPTIONS), bucket_cap_mb=bucket)
            else:
                wrapped = DDP(model, bucket_cap_mb=bucket)
                run = torch.compile(wrapped, backend="streambp", options=OPTIONS)
            wrapped.register_comm_hook(None, counting_allreduce(names, reduced))
        else:
            from torch.distributed.fsdp import fully_shard

            for layer in model.layers:
                fully_shard(layer)
            fully_shard(model)
            if mode == "fsdp2_layers":
                for layer in model.layers:
                    layer.compile(backend="streambp", options=OPTIONS)
                run = model
            else:
                run = torch.compile(model, backend="streambp", options=OPTIONS)
        before = dict(COUNTERS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = run(ids, labels)[0]
            loss.backward()
        messages = [str(w.message) for w in caught if "streamfx" in str(w.message)]
        ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
        evaluation = None
        if mode in ("ddp", "ddp_inner"):   # then an evaluation (no_grad, eval mode) of the same batch
            model.eval()
            before = dict(COUNTERS)
            with torch.no_grad():
                eval_loss = run(ids, labels)[0]
            evaluation = {"loss": eval_loss, "ran": {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}}
        grads = {}
        for n, p in model.named_parameters():
            g = p.grad
            g = g.full_tensor() if hasattr(g, "full_tensor") else g
            grads[n.removeprefix("module.")] = g.detach().clone()
        torch.save({"ran": ran, "grads": grads, "reduced": reduced, "messages": messages, "loss": loss.detach(),
                    "evaluation": evaluation}, f"{out}/rank{rank}.pt")
        finish()
    finally:
        dist.destroy_process_group()


def finish():
    """Ends a rank whose results are saved, once both ranks are done, without tearing anything
    down: a DDP reducer freed with the GIL held joins gloo's worker threads, and one of them may
    be waiting for the GIL to release a finished work's Python state (a deadlock at exit, torch
    2.13, about one run in ten)."""
    import torch.distributed as dist

    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _watched(rank, worker, *args):
    # a rank still running shortly before the launcher gives up prints every thread's stack and exits
    faulthandler.dump_traceback_later(TIMEOUT_S - 15, exit=True)
    worker(rank, *args)


def launch(mode, tmp_path, worker=None) -> list:
    """Run ``worker(rank, rendezvous, mode, out)`` (``_worker`` by default) on 2 ranks; each rank's
    saved results. ``rendezvous`` is the ``init_method`` of ``init_ranks``."""
    rendezvous = f"file://{tempfile.mkdtemp(dir=tmp_path)}/rendezvous"   # (a fresh store for every launch)
    ctx = mp.start_processes(_watched, args=(worker or _worker, rendezvous, mode, str(tmp_path)), nprocs=WORLD,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + TIMEOUT_S
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{mode}: ranks did not finish within {TIMEOUT_S}s")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]


def eager_grads():
    """Single-process eager gradients over the global batch (each rank's loss is a mean over its
    tokens, all rows count equally, so the global mean is the mean of the ranks' losses)."""
    model, make_inputs = zoo.tiny_llama()
    ids, labels = make_inputs(CASE).args
    loss = sum(model(ids[r:r + 1], labels[r:r + 1])[0] for r in range(WORLD)) / WORLD
    loss.backward()
    return {n: p.grad for n, p in model.named_parameters()}


def check(results, ref, layers_streamed):
    for res in results:
        assert_grads_match(ref, res["grads"], rtol=1e-5)
        ran = res["ran"]
        assert ran["region_forward"] == layers_streamed + 1 and ran["region_backward"] == layers_streamed + 1, ran


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["ddp", "ddp_inner"])
def test_ddp(tmp_path, mode):
    """DDP with Dynamo's DDPOptimizer at its default (the buckets do not cut this model), in both
    wrap orders: ``torch.compile(DDP(model))`` and ``DDP(torch.compile(model))``. An evaluation
    after the step (no_grad, the weights unchanged) gives the step's loss, every layer and the
    head streamed forward, nothing backward, nothing reduced."""
    results = launch(mode, tmp_path)
    check(results, eager_grads(), zoo.LAYERS)
    names = sorted(eager_grads())
    for res in results:
        assert sorted(res["reduced"]) == names, res["reduced"]  # each parameter once
        evaluation = res["evaluation"]
        torch.testing.assert_close(evaluation["loss"], res["loss"], rtol=1e-6, atol=1e-6)
        assert not evaluation["loss"].requires_grad
        ran = evaluation["ran"]
        assert ran["region_forward"] == zoo.LAYERS + 1 and ran["region_backward"] == 0, ran


@pytest.mark.slow
def test_ddp_bucket_cuts_layers(tmp_path):
    """DDP with buckets of 5 KB: DDPOptimizer cuts every decoder layer, separating each attention
    from its query/key/value producers. Those pieces run unstreamed, exactly, and the warning says
    to set ``optimize_ddp = False`` or raise ``bucket_cap_mb``; the last piece (the LM head and the
    loss) streams. Each parameter is still reduced once."""
    results = launch("ddp_small_bucket", tmp_path)
    ref = eager_grads()
    names = sorted(ref)
    for res in results:
        assert_grads_match(ref, res["grads"], rtol=1e-5)
        assert sorted(res["reduced"]) == names, res["reduced"]  # each parameter once
        ran = res["ran"]
        assert ran["region_forward"] == 1 and ran["chunks_backward"] == 3, ran  # the head, T=24 in chunks of 8
        cut = [m for m in res["messages"] if "attention outside every layer region" in m]
        assert cut and "torch._dynamo.config.optimize_ddp = False" in cut[0] and "bucket_cap_mb" in cut[0], \
            res["messages"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["fsdp2_whole", "fsdp2_layers"])
def test_fsdp2_per_layer(tmp_path, mode):
    """FSDP2 ``fully_shard`` per decoder layer and at the root; the whole model compiled (one
    graph per layer: FSDP2's hooks are outside the graphs) or each layer compiled alone. Each
    layer graph starts and ends at the residual stream and streams. Compiling the whole model,
    the hooks break the graph inside the loop over the layers, so Dynamo runs the model's forward
    (its norm, head and loss) eagerly: one warning names it; compiled per layer, nothing is said."""
    results = launch(mode, tmp_path)
    ref = eager_grads()
    for res in results:
        assert_grads_match(ref, res["grads"], rtol=1e-5)
        ran = res["ran"]
        # every layer streams, T=24 in 3 chunks of 8; the root's loop graph-breaks at FSDP2's
        # disabled hooks, so Dynamo leaves the head and the loss to run eagerly
        assert ran["region_forward"] == zoo.LAYERS and ran["region_backward"] == zoo.LAYERS, ran
        assert ran["chunks_backward"] == zoo.LAYERS * 3, ran
        skipped = [m for m in res["messages"] if m.startswith("streamfx: Dynamo runs") and "TinyLlama.forward" in m]
        assert len(skipped) == (mode == "fsdp2_whole") == len(res["messages"]), res["messages"]


def _tensor_parallel_worker(rank, rendezvous, mode, out):
    import copy

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from streamfx.runtime import COUNTERS

    init_ranks(rank, rendezvous)
    try:
        mesh = init_device_mesh("cpu", (WORLD,))
        model, make_inputs = zoo.qwen3_sdpa()
        kwargs = make_inputs("prompt").kwargs
        plan = {}
        for i in range(len(model.model.layers)):
            at = f"model.layers.{i}."
            plan.update({at + f"self_attn.{p}_proj": ColwiseParallel() for p in "qkv"})
            plan.update({at + f"mlp.{p}_proj": ColwiseParallel() for p in ("gate", "up")})
            plan.update({at + "self_attn.o_proj": RowwiseParallel(), at + "mlp.down_proj": RowwiseParallel()})
        ref = copy.deepcopy(model)
        parallelize_module(model, mesh, plan)
        parallelize_module(ref, mesh, plan)
        ref_loss = ref(**kwargs).loss
        ref_loss.backward()
        compiled = torch.compile(model, backend="streambp", options={**OPTIONS, "strict": mode == "strict"})
        before = dict(COUNTERS)
        raised = None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                loss = compiled(**kwargs).loss
                loss.backward()
            except Exception as err:   # noqa: BLE001 - strict: the error is the result
                raised, loss = f"{type(err).__name__}: {err}", ref_loss
        full = lambda g: g.full_tensor() if hasattr(g, "full_tensor") else g   # noqa: E731
        grads = {n: full(p.grad).detach().clone() for n, p in model.named_parameters() if p.grad is not None}
        ref_grads = {n: full(p.grad).detach().clone() for n, p in ref.named_parameters()}
        torch.save({"ran": {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}, "grads": grads,
                    "ref_grads": ref_grads, "loss": loss.detach(), "ref_loss": ref_loss.detach(), "raised": raised,
                    "messages": [str(w.message) for w in caught if "streamfx" in str(w.message)]},
                   f"{out}/rank{rank}.pt")
        finish()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["warn", pytest.param("strict", marks=pytest.mark.extended)])
def test_tensor_parallel_layers_run_unstreamed_and_say_why(tmp_path, mode):
    """Tensor parallelism (DTensor weights, colwise/rowwise projections) on 2 ranks: AOTAutograd
    traces the DTensors' own backward, its collectives not the derivative of the forward's ops,
    which a streamed joint (differentiating the forward again) would lose: the graph runs
    unstreamed, its gradients those of eager tensor parallelism, and one warning names the
    DTensor weight and FSDP2 / ZeRO as the sharding that streams; strict=True raises."""
    results = launch(mode, tmp_path, _tensor_parallel_worker)
    for res in results:
        if mode == "strict":
            assert res["raised"] and res["raised"].startswith("StreamBPError") and "DTensor" in res["raised"], res
            continue
        assert res["raised"] is None, res["raised"]
        torch.testing.assert_close(res["loss"], res["ref_loss"], rtol=1e-6, atol=1e-6)
        assert_grads_match(res["ref_grads"], res["grads"], rtol=1e-5)
        assert res["ran"].get("region_forward", 0) == 0, res["ran"]
        [said] = res["messages"]
        assert "tensor subclass (DTensor: " in said and "q_proj" in said and "FSDP2" in said, said


class _CopyToShards(torch.autograd.Function):
    """Megatron's f: identity forward, the input gradient summed over the ranks' shards."""
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        import torch.distributed._functional_collectives as funcol

        return funcol.all_reduce(g, "sum", "0")


class _ReduceFromShards(torch.autograd.Function):
    """Megatron's g: the shards' partial outputs summed over the ranks, identity backward."""
    @staticmethod
    def forward(ctx, x):
        import torch.distributed._functional_collectives as funcol

        return funcol.all_reduce(x, "sum", "0")

    @staticmethod
    def backward(ctx, g):
        return g


def _manual_tp_model():
    """A 2-layer causal LM whose attention heads and MLP columns are split over the 2 ranks by
    hand (each rank its own shard's weights), joined by the Functions above."""
    import torch.nn as nn
    import torch.nn.functional as F

    class Block(nn.Module):
        def __init__(self, d=32, heads=2, hd=8):
            super().__init__()
            self.heads, self.hd = heads, hd
            self.n1, self.n2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.o = nn.Linear(d, 3 * heads * hd, bias=False), nn.Linear(heads * hd, d, bias=False)
            self.up, self.down = nn.Linear(d, d, bias=False), nn.Linear(d, d, bias=False)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(_CopyToShards.apply(self.n1(x))).view(B, T, 3, self.heads, self.hd).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T, -1)
            x = x + _ReduceFromShards.apply(self.o(a))
            return x + _ReduceFromShards.apply(self.down(F.gelu(self.up(_CopyToShards.apply(self.n2(x))))))

    class LM(nn.Module):
        def __init__(self, vocab=64, d=32):
            super().__init__()
            self.emb, self.blocks = nn.Embedding(vocab, d), nn.ModuleList(Block() for _ in range(2))
            self.norm, self.head = nn.LayerNorm(d), nn.Linear(d, vocab, bias=False)

        def forward(self, ids, labels):
            x = self.emb(ids)
            for block in self.blocks:
                x = block(x)
            return F.cross_entropy(self.head(self.norm(x)).flatten(0, 1), labels.flatten())

    return LM()


def _manual_tp_worker(rank, rendezvous, mode, out):
    import copy

    import torch.distributed as dist

    from streamfx.runtime import COUNTERS

    init_ranks(rank, rendezvous)
    try:
        torch.manual_seed(0)
        model = _manual_tp_model()
        torch.manual_seed(1 + rank)   # each rank's shard its own
        for block in model.blocks:
            for w in (block.qkv.weight, block.o.weight, block.up.weight, block.down.weight):
                torch.nn.init.normal_(w, std=0.2)
        g = torch.Generator().manual_seed(5)
        ids, labels = torch.randint(0, 64, (2, 24), generator=g), torch.randint(0, 64, (2, 24), generator=g)
        ref = copy.deepcopy(model)
        ref_loss = ref(ids, labels)
        ref_loss.backward()
        compiled = torch.compile(model, backend="streambp", options=OPTIONS)
        before = dict(COUNTERS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = compiled(ids, labels)
            loss.backward()
        torch.save({"ran": {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}, "loss": loss.detach(),
                    "ref_loss": ref_loss.detach(), "raised": None,
                    "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
                    "ref_grads": {n: p.grad.clone() for n, p in ref.named_parameters()},
                    "messages": [str(w.message) for w in caught if "streamfx" in str(w.message)]},
                   f"{out}/rank{rank}.pt")
        finish()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_tensor_parallelism_by_hand_runs_its_layers_unstreamed_and_says_why(tmp_path):
    """Tensor parallelism written with Functions that call collectives (Megatron's f and g): the
    layers run unstreamed (a collective is not run per chunk: every rank would have to run the
    same chunks), the warning names the collective and its line; the head streams; exact."""
    for res in launch("manual", tmp_path, _manual_tp_worker):
        torch.testing.assert_close(res["loss"], res["ref_loss"], rtol=1e-6, atol=1e-6)
        assert_grads_match(res["ref_grads"], res["grads"], rtol=1e-5)
        assert res["ran"]["region_forward"] == 1 and res["ran"]["chunks_forward"] == 3, res["ran"]
        [said] = res["messages"]
        assert "calls a collective (_c10d_functional.all_reduce at " in said and "funcol.all_reduce(g" in said, said
        assert "communicates between processes" in said, said
