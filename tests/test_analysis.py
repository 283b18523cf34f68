"""Per-pass tests on small graphs: sequence dims, node classes, attention sites, masks, regions."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st

import streamfx
from streamfx.passes.record import get
from tiers import examples
from streamfx.passes.schedule import chunk_count


class TinyLM(torch.nn.Module):
    """Embedding -> n attention+MLP blocks -> LM head -> cross entropy. `attn` picks the attention."""

    def __init__(self, V, d, H, layers=1, attn="sdpa", window=None, T_max=64):
        super().__init__()
        self.emb = torch.nn.Embedding(V, d)
        self.qkv = torch.nn.ModuleList(torch.nn.Linear(d, 3 * d, bias=False) for _ in range(layers))
        self.mlp = torch.nn.ModuleList(torch.nn.Linear(d, d) for _ in range(layers))
        self.head = torch.nn.Linear(d, V, bias=False)
        self.H, self.attn, self.window = H, attn, window
        mask = torch.tril(torch.ones(T_max, T_max))
        if window:
            mask = mask * torch.triu(torch.ones(T_max, T_max), diagonal=-(window - 1))
        self.register_buffer("bias", mask.view(1, 1, T_max, T_max))

    def forward(self, idx, targets):
        B, T = idx.shape
        h = self.emb(idx)
        for qkv, mlp in zip(self.qkv, self.mlp):
            q, k, v = qkv(h).split(h.shape[-1], dim=2)
            q, k, v = (t.view(B, T, self.H, -1).transpose(1, 2) for t in (q, k, v))
            if self.attn == "sdpa":
                y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            elif self.attn == "bidirectional":
                y = F.scaled_dot_product_attention(q, k, v)
            else:
                att = (q @ k.transpose(-2, -1)) / math.sqrt(k.shape[-1])
                att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
                y = F.softmax(att, dim=-1) @ v
            h = h + y.transpose(1, 2).reshape(B, T, -1)
            h = h + mlp(F.gelu(h))
        logits = self.head(h)
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-100)


def analyse(model, *args):
    report = streamfx.explain(model, *args)
    assert len(report.analyses) == 1
    return report, report.analyses[0]


def nodes_of(analysis, name):
    return [n for n in analysis.fwd_nodes if n.op == "call_function" and n.target.__name__.startswith(name)]


@pytest.mark.fast
@pytest.mark.parametrize("attn", ["sdpa", "matmul"])
def test_roles_are_structural_when_hidden_equals_T_equals_vocab(attn):
    """d == T == V == 8 and B == H == 2: every size coincides, the roles must still be right."""
    torch.manual_seed(0)
    n = 8
    model = TinyLM(V=n, d=n, H=2, attn=attn)
    idx = torch.randint(0, n, (2, n))
    report, a = analyse(model, idx, idx)
    emb = nodes_of(a, "embedding")[0]
    assert get(emb).dims == (None, "q", None)
    assert get(emb).cls == "token-local"
    weights = [p for p in a.fwd_nodes if p.op == "placeholder" and p.meta["val"].dim() == 2
               and p.meta["val"].is_floating_point()]
    assert weights and all(get(w).cls == "sequence-free" and get(w).dims == (None, None) for w in weights)
    mms = nodes_of(a, "mm")
    assert mms and all(get(m).dims[0] == "q" for m in mms)  # rows are (B*T) tokens
    assert len(report.attention_sites) == 1
    site = report.attention_sites[0]
    assert site.mask_kind == "causal" and site.is_causal
    if attn == "matmul":
        scores = site.nodes - {site.output}
        assert any(get(s).dims[-2:] == ("q", "k") for s in scores)
        assert all(get(s).cls == "causal-mixing" for s in site.nodes)
    sums = [s for s in a.fwd_nodes if get(s) and get(s).cls == "sequence-reduction"]
    assert sums, "the loss sums over tokens"


@pytest.mark.fast
def test_sliding_window_mask_recognised():
    model = TinyLM(V=16, d=8, H=2, attn="matmul", window=3)
    idx = torch.randint(0, 16, (1, 10))
    report, _ = analyse(model, idx, idx)
    site = report.attention_sites[0]
    assert (site.mask_kind, site.window) == ("sliding-window", 3)


@pytest.mark.fast
def test_bidirectional_attention_is_not_causal():
    model = TinyLM(V=16, d=8, H=2, attn="bidirectional")
    idx = torch.randint(0, 16, (1, 10))
    report, _ = analyse(model, idx, idx)
    assert [s.is_causal for s in report.attention_sites] == [False]


@pytest.mark.fast
@pytest.mark.heavy
def test_regions_cut_at_residual_stream():
    model = TinyLM(V=32, d=16, H=2, layers=3)
    idx = torch.randint(0, 32, (2, 12))
    report, a = analyse(model, idx, idx)
    kinds = [r.name for r in report.regions]
    assert kinds == ["layer.0", "layer.1", "layer.2", "head"]
    for r in report.regions[:-1]:
        assert len(r.attention) == 1
    layer_entries = [r.entry for r in report.regions]
    assert all(get(e).dims == (None, "q", None) for e in layer_entries)
    assert [p.name for p in report.plan] == kinds  # every layer and the head stream
    assert "head" in str(report) and "attention sites: 3" in str(report)


@pytest.mark.fast
def test_unknown_mixing_op_is_reported_with_source_line():
    class CumsumHead(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(16, 8)
            self.head = torch.nn.Linear(8, 16)

        def forward(self, idx, targets):
            h = self.emb(idx).cumsum(dim=1)  # mixes tokens along the sequence
            return F.cross_entropy(self.head(h).view(-1, 16), targets.view(-1))

    idx = torch.randint(0, 16, (1, 9))
    a = streamfx.explain(CumsumHead(), idx, idx).analyses[0]
    cums = nodes_of(a, "cumsum")
    assert cums and get(cums[0]).cls == "unknown-mixing"


@pytest.mark.fast
def test_source_line_is_the_users_frame_wherever_the_project_lives():
    """The user's innermost frame is found by where torch and streamfx are installed, not by the
    names in a path: a project in a folder called ``streamfx`` or ``torch`` is still the user's."""
    import os

    import torch.nn.functional
    from streamfx.errors import source_line

    torch_file = os.path.abspath(torch.nn.functional.__file__)
    for user in ("/home/me/streamfx/tests/test_model.py", "/work/torch/train.py", "/srv/run.py"):
        trace = (f'  File "{user}", line 42, in forward\n    h = h + conv(F.pad(h, (2, 0)))\n'
                 f'  File "{torch_file}", line 5823, in pad\n    return torch._C._nn.pad(input, pad, mode, value)\n')
        node = type("Node", (), {"meta": {"stack_trace": trace}})()
        assert source_line(node) == f" at {user}:42 (h = h + conv(F.pad(h, (2, 0))))", source_line(node)


@settings(max_examples=examples(10), deadline=None, derandomize=True)
@given(B=st.integers(1, 3), T=st.integers(2, 9), H=st.sampled_from([1, 2]), hd=st.integers(1, 4),
       V=st.integers(2, 9))
def test_seq_roles_property(B, T, H, hd, V):
    """Over random sizes (with every kind of coincidence), the seq role sits on the token dim."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    d = H * hd
    model = TinyLM(V=V, d=d, H=H, attn="matmul", T_max=16)
    idx = torch.randint(0, V, (B, T))
    report, a = analyse(model, idx, idx)
    emb = nodes_of(a, "embedding")[0]
    assert get(emb).dims == (None, "q", None)
    assert len(report.attention_sites) == 1
    site = report.attention_sites[0]
    assert site.mask_kind == "causal"
    # the attention output (B*H, T, hd) or (B, H, T, hd) carries the query role on its T dim
    out_dims = get(site.output).dims
    assert out_dims.count("q") == 1 and out_dims[-2] == "q"


@pytest.mark.fast
def test_symbolic_sequence_length_is_analysed_and_streams():
    """dynamic=True: T is a SymInt. The analysis finds the sequence dim, both attention sites
    (causal) and the layer and head regions, every region streams, and gradients equal eager's
    at every length."""
    import copy

    from streamfx.backend import compile_graph
    from streamfx.config import StreamConfig
    from streamfx.runtime import COUNTERS
    from streamfx.session import Session

    torch.manual_seed(0)
    model = TinyLM(V=24, d=16, H=2, layers=2)
    ref = copy.deepcopy(model)
    config = StreamConfig(codegen="eager", chunk_size=5, head_chunk_size=4)
    analyses: list = []
    compiled = torch.compile(model, backend=lambda gm, ex: compile_graph(gm, ex, config, Session(config, analyses)),
                             dynamic=True)
    for T in (12, 13, 7):
        idx = torch.randint(0, 24, (2, T))
        model.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
        before = dict(COUNTERS)
        compiled(idx, idx).backward()
        ref(idx, idx).backward()
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6, msg=name)
        # two layers of ceil(T/5) chunks and a head of ceil(T/4), forward and backward
        assert COUNTERS["chunks_backward"] - before["chunks_backward"] == 2 * chunk_count(T, 5) + chunk_count(T, 4)
    assert len(analyses) == 1  # one compile serves every length
    a = analyses[-1]
    T = a.sites[0].query.meta["val"].shape[-2]
    assert isinstance(T, torch.SymInt)
    assert len(a.sites) == 2 and all(s.is_causal and s.mask_kind == "causal" for s in a.sites)
    assert sorted(r.name for r in a.regions) == ["head", "layer.0", "layer.1"]
    assert all(a.sd.seq_dim(s.query) == 2 for s in a.sites)
    assert a.refusals == [] and sorted(p.name for p in a.plans) == ["head", "layer.0", "layer.1"]
