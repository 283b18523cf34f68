"""Axis rules on small ATen graphs traced with make_fx (no torch.compile): fast, structural.

A hypothesis strategy draws a chain of token-local ops on a [B, T, d] tensor (pointwise ops,
matmuls over features, norms, views that merge or split dims, transposes, head splits) with
sizes that coincide in every way (d == T == B...). The sequence dim is followed through the
chain by hand; the analysis must put the query role exactly there and class every op
token-local or sequence-free. Ops that mix tokens (cumsum, a sum over the sequence) must be
classed as such.
"""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings, strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

from streamfx.passes import seq_dims
from streamfx.passes.rules import RULES

pytestmark = pytest.mark.fast  # the whole module is in the fast tier

aten = torch.ops.aten


def analyse(fn, *args):
    gm = make_fx(fn)(*args)
    sd = seq_dims.infer_axes(gm.graph)
    x = gm.graph.find_nodes(op="placeholder")[0]
    sd.set_seq(sd.axes[x][0][1][0])  # the input's dim 1 is the sequence
    out = gm.graph.find_nodes(op="output")[0].args[0][0]
    classes = {n: sd.classify(n) for n in gm.graph.nodes if n.op == "call_function"}
    return gm, sd, out, classes


# Each op maps (x, seq dim of x) -> (y, seq dim of y); "w" is a feature-sized weight source.
def _pointwise(x, t, w):
    return F.gelu(x * 2.0 + 1.0), t


def _linear(x, t, w):
    d = x.shape[-1]
    return x @ w[:d, :d].t(), t


def _norm(x, t, w):
    return F.layer_norm(x, x.shape[-1:]), t


def _merge_rows(x, t, w):
    if x.dim() != 3 or t != 1:
        return x, t
    B, T, d = x.shape
    return (x.reshape(B * T, d) + 1.0).reshape(B, T, d), t


def _transpose(x, t, w):
    if x.dim() != 3:
        return x, t
    return x.transpose(0, 1).contiguous(), {0: 1, 1: 0}.get(t, t)


def _heads(x, t, w):
    """[B, T, d] -> [B, H, T, d/H] (softmax over features) -> back."""
    if x.dim() != 3 or t != 1 or x.shape[-1] % 2:
        return x, t
    B, T, d = x.shape
    h = x.view(B, T, 2, d // 2).transpose(1, 2)
    h = torch.softmax(h, dim=-1)
    return h.transpose(1, 2).reshape(B, T, d), t


def _feature_sum(x, t, w):
    return x - x.sum(-1, keepdim=True), t


OPS = [_pointwise, _linear, _norm, _merge_rows, _transpose, _heads, _feature_sum]


@settings(max_examples=40, deadline=None, derandomize=True)
@given(B=st.integers(1, 4), T=st.integers(2, 6), d=st.sampled_from([2, 4, 6]),
       ops=st.lists(st.sampled_from(OPS), min_size=1, max_size=6))
def test_sequence_role_follows_the_token_dim(B, T, d, ops):
    where = {}

    def fn(x, w):
        t = 1
        for op in ops:
            x, t = op(x, t, w)
        where["t"] = t
        return (x,)

    gm, sd, out, classes = analyse(fn, torch.randn(B, T, d), torch.randn(8, 8))
    roles = sd.roles(out)
    assert roles.count("q") == 1 and roles.index("q") == where["t"], (roles, where, [o.__name__ for o in ops])
    bad = {n.format_node(): c for n, c in classes.items() if c not in (seq_dims.TOKEN_LOCAL, seq_dims.SEQ_FREE)}
    assert not bad, bad


@pytest.mark.parametrize("op, cls", [
    (lambda x: x.cumsum(1), seq_dims.UNKNOWN_MIXING),
    (lambda x: x.flip(1), seq_dims.UNKNOWN_MIXING),
    (lambda x: x.sum(1), seq_dims.SEQ_REDUCTION),
    (lambda x: torch.softmax(x, dim=1), seq_dims.UNKNOWN_MIXING),
    (lambda x: x[:, 1:] - x[:, :-1], seq_dims.UNKNOWN_MIXING),
    (lambda x: x.mean(-1), seq_dims.TOKEN_LOCAL),
])
def test_mixing_ops_are_classed(op, cls):
    gm, sd, out, classes = analyse(lambda x: (op(x),), torch.randn(2, 5, 5))
    assert cls in set(classes.values()), {n.name: c for n, c in classes.items()}


def test_hidden_equal_to_T_stays_a_feature_axis():
    """d == T == 4: the matmul contracts the feature axis; the token axis keeps its role."""
    gm, sd, out, classes = analyse(lambda x, w: ((x @ w).transpose(1, 2),), torch.randn(4, 4, 4), torch.randn(4, 4))
    assert sd.roles(out) == (None, None, "q")


def test_broken_rule_fails_loudly_under_verification(monkeypatch):
    """STREAMFX_VERIFY=1 (set for the tests): a rule that raises is a failing test, not an op
    quietly classed "unknown"; without verification the op is classed unknown-mixing."""
    def broken(node, table, ax):
        raise RuntimeError("deliberately broken rule")

    monkeypatch.setitem(RULES, aten.gelu.default, broken)
    fn = lambda x: (F.gelu(x),)  # noqa: E731
    monkeypatch.setenv("STREAMFX_VERIFY", "1")
    with pytest.raises(RuntimeError, match="deliberately broken rule"):
        analyse(fn, torch.randn(2, 5, 3))
    monkeypatch.setenv("STREAMFX_VERIFY", "0")
    gm, sd, out, classes = analyse(fn, torch.randn(2, 5, 3))
    gelu = next(n for n in gm.graph.nodes if n.target is aten.gelu.default)
    assert classes[gelu] == seq_dims.UNKNOWN_MIXING


def test_a_flat_dim_broadcast_with_merged_tokens_is_their_product():
    """Random numbers drawn flat, ``[B*T, E]``, beside tokens flattened to ``[B*T, E]``
    (Phi-3.5-MoE's router noise): broadcasting lines the two up, so the drawn values' rows are
    the tokens' (batch x sequence), in either operand order; the values, and what is computed
    from them, are per token."""
    def fn(x, w):
        B, T, d = x.shape
        scores = x.reshape(B * T, d) @ w
        noise = torch.rand(B * T, w.shape[1]).log()
        return (scores - noise, noise + scores)

    gm, sd, out, classes = analyse(fn, torch.randn(2, 5, 4), torch.randn(4, 3))
    outs = gm.graph.find_nodes(op="output")[0].args[0]
    noise = next(n for n in gm.graph.nodes if n.target is aten.log.default)
    for n in (*outs, noise):
        assert sd.roles(n) == ("q", None) and not sd.seq_is_atomic(n), (n, sd.roles(n))


# Reductions in every schema form: a dims list, one dim, a dim keyword, a dim after other
# arguments, no dim (every dim), several outputs; and order statistics, which carry no tag.
REDUCTION_FORMS = {
    "any.dims": lambda x, d, k: aten.any.dims(x > 0, [d], k),
    "all.dims": lambda x, d, k: aten.all.dims(x > 0, [d], k),
    "var.dim": lambda x, d, k: aten.var.dim(x, [d], True, k),
    "norm.ScalarOpt_dim": lambda x, d, k: aten.norm.ScalarOpt_dim(x, 2, [d], k),
    "nansum": lambda x, d, k: aten.nansum.default(x, [d], k),
    "aminmax": lambda x, d, k: aten.aminmax.default(x, dim=d, keepdim=k)[1],
    "std_mean.correction": lambda x, d, k: aten.std_mean.correction(x, [d], correction=0, keepdim=k)[0],
    "median.dim": lambda x, d, k: aten.median.dim(x, d, k)[0],
    "mode": lambda x, d, k: aten.mode.default(x, d, k)[0],
    "kthvalue": lambda x, d, k: aten.kthvalue.default(x, 2, d, k)[0],
    "logsumexp": lambda x, d, k: aten.logsumexp.default(x, [d], k),
}


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("form", sorted(REDUCTION_FORMS))
def test_every_reduction_form_reduces_the_dims_its_schema_names(form, keepdim):
    """Over the features a reduction is token-local and its result keeps the token dim where the
    schema's ``keepdim`` puts it; over the tokens it is a sum-like reduction of the sequence."""
    op = REDUCTION_FORMS[form]
    x = torch.randn(2, 5, 5)
    gm, sd, out, classes = analyse(lambda x: (op(x, -1, keepdim),), x)
    reduced = [n for n in gm.graph.nodes if n.op == "call_function" and classes[n] != seq_dims.TOKEN_LOCAL]
    assert not reduced, {n.name: classes[n] for n in reduced}
    assert sd.roles(out) == ((None, "q", None) if keepdim else (None, "q"))
    gm, sd, out, classes = analyse(lambda x: (op(x, 1, keepdim),), x)
    assert seq_dims.SEQ_REDUCTION in set(classes.values()), {n.name: c for n, c in classes.items()}
    assert seq_dims.UNKNOWN_MIXING not in set(classes.values()), {n.name: c for n, c in classes.items()}
    assert "q" not in sd.roles(out)
