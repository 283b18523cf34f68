"""DeepSpeed ZeRO-2 and ZeRO-3 on 2 CPU ranks (``DS_ACCELERATOR=cpu``, gloo), each test launching
its own processes. Each rank computes its half of a global batch through the engine compiled
with ``backend="streambp"``; the full gradients after one backward (``safe_get_full_grad``) must
equal single-process eager autograd's over the global batch, and the streamed regions are counted.
Under ZeRO-3 the decoder layers are leaf modules (``set_z3_leaf_modules``): their parameters are
gathered once per layer, outside the layer's graph."""
import os
import sys
import warnings

import pytest
import torch

import zoo
from conftest import assert_grads_match
from test_distributed import CASE, OPTIONS, WORLD, eager_grads, finish, launch

try:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed  # noqa: F401
    MISSING = None
except ImportError as err:  # not installed: .ci/setup installs it (its CPU comm op compiled at install)
    MISSING = f"deepspeed is not importable: {err}"


def _worker(rank, port, mode, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(WORLD), OMP_NUM_THREADS="1", STREAMFX_VERIFY="1", DS_ACCELERATOR="cpu")
    sys.path.insert(0, os.path.dirname(__file__))
    import deepspeed
    import torch.distributed as dist
    from deepspeed.utils import safe_get_full_grad, set_z3_leaf_modules

    from streamfx.runtime import COUNTERS

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    deepspeed.init_distributed(dist_backend="gloo")  # adopts the process group
    try:
        model, make_inputs = zoo.tiny_llama()
        ids, labels = make_inputs(CASE).args
        ids, labels = ids[rank:rank + 1], labels[rank:rank + 1]
        stage = {"zero2": 2, "zero3": 3}[mode]
        if stage == 3:
            set_z3_leaf_modules(model, [zoo.LlamaBlock])
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
                  "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
        engine.compile(backend="streambp", compile_kwargs={"options": OPTIONS})
        before = dict(COUNTERS)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loss = engine(ids, labels)[0]
            engine.backward(loss)
        messages = [str(w.message) for w in caught if "streamfx" in str(w.message)]
        ran = {k: COUNTERS[k] - before.get(k, 0) for k in COUNTERS}
        grads = {n: safe_get_full_grad(p).detach().clone() for n, p in engine.module.named_parameters()}
        torch.save({"ran": ran, "grads": grads, "loss": loss.detach(), "messages": messages}, f"{out}/rank{rank}.pt")
        finish()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
@pytest.mark.parametrize("mode", ["zero2", "zero3"])
def test_deepspeed_zero(tmp_path, mode):
    results = launch(mode, tmp_path, _worker)
    ref = eager_grads()
    # ZeRO-2 keeps the module whole: one graph, every layer and the head stream. ZeRO-3's
    # compiler-disabled fetch hooks on the final norm and the LM head cut them and the loss apart
    # (no graph holds the head with its loss), so only the leaf layers stream, as under FSDP2,
    # and Dynamo runs the model's forward (its norm, head and loss) eagerly: one warning names it.
    # T=24 runs in 3 chunks of 8.
    regions = {"zero2": zoo.LAYERS + 1, "zero3": zoo.LAYERS}[mode]
    for res in results:
        assert_grads_match(ref, res["grads"], rtol=1e-5)
        ran = res["ran"]
        assert ran["region_forward"] == regions and ran["region_backward"] == regions, ran
        assert ran["chunks_backward"] == regions * 3, ran
        skipped = [m for m in res["messages"] if m.startswith("streamfx: Dynamo runs") and "TinyLlama.forward" in m]
        assert len(skipped) == (mode == "zero3") == len(res["messages"]), res["messages"]
