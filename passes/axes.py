"""Abstract axes of a graph: which tensor dims index the same thing, found structurally.

Every dim of every tensor value gets a tuple of atomic axis ids (a product: a view that merges
B and T gives ``(b, t)``; a broadcast size-1 dim gives ``()``). Rules say how an op's output
dims relate to its input dims (``rules.py``); this driver owns the union-find and the sizes, so a
rule is a few lines. Nothing is decided by equal sizes alone: axes are unified only where an op
aligns two dims (broadcasting, matmul contraction, attention's key/value), so a hidden size
equal to T stays a different axis.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

from .graphs import is_one, less, same

Axes = tuple  # tuple[tuple[int, ...], ...]: per dim, a product of atomic axis ids


@dataclasses.dataclass(frozen=True)
class RuleOut:
    """What a rule says about one node.

    out:     axes of each output (a list with one entry per tensor output; None for non-tensors).
    reduced: (input node, dim) pairs the op sums or contracts over.
    mixed:   (input node, dim) pairs along which values of different positions are combined
             in a way that is not a reduction (cumsum, conv, shift, sort, softmax, ...).
    """

    out: list
    reduced: tuple = ()
    mixed: tuple = ()


class AxisTable:
    """Union-find over atomic axes plus the size of each atomic axis."""

    def __init__(self) -> None:
        self.parent: dict[int, int] = {}
        self.size: dict[int, Any] = {}
        self.slices: list[tuple[int, int]] = []  # (atom of a slice's dim, atom of the dim it slices)
        self.perms: dict = {}     # sort node -> (atoms of its sorted dim, atoms of the dim it permutes)
        self.expand: dict = {}    # atom -> the product of atoms it was identified with
        # (product of atoms, atom): a product identified with an older atom (the sequence split
        # into [T/2, 2] inside a scan and merged back) is that atom wherever the product appears
        # whole in a dim; each of its atoms alone stays a part of it
        self.runs: list = []
        # (size, size) of two axes made one whose symbolic sizes are not provably equal (a
        # gather's index may be shorter than its input in Dynamo's view): equal in every call
        # that streams, which the runtime checks (each compiled chunk graph reads one size per axis)
        self.assumed: list[tuple] = []
        self.stacks: dict = {}    # (pieces, other dims' atoms) -> the axis of a stack of size-1 columns
        # atom of one group of a sorted dim split by its groups' sizes -> (atoms of the sorted dim,
        # the sizes (graph nodes, in order), the group's index): its rows are some of those rows
        self.groups: dict = {}
        # atom -> the atoms of its leading factor: a view that merged whole atoms with part of the
        # next one made it (JetMoE's [slot, heads x dim] -> [slot x heads, dim]); its index is
        # the factor's index times the rest, so a view that splits the factor's size off its
        # front gives the factor back
        self.leads: dict = {}
        self.rests: dict = {}     # atom with a leading factor -> the atom of the rest of it (``_open_leads``)
        # atom -> (atom of the rows it holds, left, right): a dim padded or convolved along another
        # (a causal convolution's ``pad(x, (k - 1, 0))`` or ``conv1d(x, padding=k - 1)``): element j
        # belongs to row j - left of the other, and ``right`` rows after its last are extra
        self.shifted: dict = {}
        self._ids = itertools.count()

    def fresh(self, size) -> tuple:
        if is_one(size):
            return ()
        a = next(self._ids)
        self.parent[a] = a
        self.size[a] = size
        return (a,)

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def canon(self, dim: tuple) -> tuple:
        """Root atoms of a dim, with atoms identified with a product replaced by its atoms, and
        products identified with an older atom (``runs``) replaced by it."""
        out: list = []
        for a in dim:
            r = self.find(a)
            out.extend(self.canon(self.expand[r]) if r in self.expand else (r,))
        return self._collapse(out) if self.runs and len(out) > 1 else tuple(out)

    def _collapse(self, atoms: list) -> tuple:
        changed = True
        while changed:
            changed = False
            for product, atom in self.runs:
                run = [self.find(a) for a in product]
                for i in range(len(atoms) - len(run) + 1):
                    if atoms[i:i + len(run)] == run:
                        atoms[i:i + len(run)] = [self.find(atom)]
                        changed = True
                        break
        return tuple(atoms)

    def identify(self, dim: tuple, product: tuple, keep_older: bool = False) -> None:
        """Make a one-atom dim (a flat ``empty(n)`` or ``arange(n)``) the product ``product`` of
        the same size, where an op aligns the two (unify() only pairs dims atom by atom).
        ``keep_older``: where the atom is older than every atom of the product (made by an op
        that split it, a scan's ``[T/2, 2]`` view), the product is written as that atom instead,
        so the tensors before the split keep their one axis."""
        dim, product = self.canon(dim), self.canon(product)
        if len(dim) == 1 and len(product) > 1 and dim[0] not in product:
            whole = 1
            for a in product:
                whole = whole * self.size[a]
            if not same(self.size[dim[0]], whole):
                return
            if keep_older and dim[0] < min(product):
                self.runs.append((product, dim[0]))
            else:
                self.expand[dim[0]] = product
        else:
            self.unify(dim, product)

    def shift_of(self, dim: tuple):
        """(atom of the rows, left, right) of a one-atom dim: its own atom with (0, 0), or the
        record of a padded or convolved dim (``shifted``); None for a product."""
        dim = self.canon(dim)
        if len(dim) != 1:
            return None
        for a, (rows, left, right) in self.shifted.items():
            if self.find(a) == dim[0]:
                return self.find(rows), left, right
        return dim[0], 0, 0

    def shifted_dim(self, rows: int, left: int, right: int, size) -> tuple:
        """The axis of a dim holding ``rows`` shifted by ``left`` with ``right`` extra rows: the
        rows' own axis where both are 0, else a fresh atom recording them."""
        if left == 0 and right == 0:
            return (rows,)
        atom = self.fresh(size)
        if atom:
            self.shifted[atom[0]] = (rows, left, right)
        return atom

    def permuted(self, dim: tuple, node) -> tuple:
        """Fresh atoms for ``dim`` in another order (a sort along it): the same sizes, recorded
        as a permutation of ``dim`` (its rows are the same tokens, reordered)."""
        dim = self.canon(dim)  # an atom identified with a product permutes as that product
        new = tuple(self.fresh(self.size[self.find(a)])[0] for a in dim)
        self.perms[node] = (new, tuple(dim))
        return new

    def perm_pairs(self) -> list:
        """(atom, atom it permutes) of every sorted dim."""
        return [(n, o) for new, old in self.perms.values() for n, o in zip(new, old)]

    def group(self, rows: tuple, sizes: tuple, i: int, size) -> tuple:
        """A fresh atom for group ``i`` of the sorted dim ``rows`` split by ``sizes``."""
        atom = self.fresh(size)
        if atom:
            self.groups[atom[0]] = (self.canon(rows), tuple(sizes), i)
        return atom

    def group_of(self, dim: tuple):
        """(rows, sizes, index) when ``dim`` is one group of a split sorted dim, else None."""
        dim = self.canon(dim)
        if len(dim) != 1:
            return None
        for g, (rows, sizes, i) in self.groups.items():
            if self.find(g) == dim[0]:
                return self.canon(rows), sizes, i
        return None

    def group_pairs(self) -> list:
        """(group atom, an atom of the dim it is a part of) of every group."""
        return [(g, r) for g, (rows, _, _) in self.groups.items() for r in rows]

    def unify(self, x: tuple, y: tuple) -> None:
        """Make two dims the same axis; products unify atom by atom when their arity matches."""
        if len(x) != len(y):
            return
        for a, b in zip(x, y):
            ra, rb = self.find(a), self.find(b)
            if ra != rb:
                root, other = min(ra, rb), max(ra, rb)
                self.parent[other] = root
                if not isinstance(self.size[root], int) and not isinstance(self.size[other], int) \
                        and not same(self.size[root], self.size[other]):
                    self.assumed.append((self.size[root], self.size[other]))
                if isinstance(self.size[other], int) and not isinstance(self.size[root], int):
                    self.size[root] = self.size[other]  # one axis: a static size is its size

    def fresh_like(self, shape) -> Axes:
        return tuple(self.fresh(s) for s in shape)

    def regroup(self, in_axes: Axes, in_shape, out_shape, lost: list | None = None) -> Axes:
        """Axes of a view/reshape: group dims by running products; merges concatenate atoms,
        splits hand out the atoms of the merged dim in order (fresh atoms if sizes disagree).
        ``lost``: gets the input dims an atom of which no output dim carries (split into fresh
        atoms: the sequence viewed as ``[T/2, 2]`` is two new axes, neither of them the tokens)."""
        out: list = []
        i = j = 0
        n_in, n_out = len(in_shape), len(out_shape)
        in_axes = tuple(self.canon(d) for d in in_axes)
        while j < n_out:
            if i < n_in and is_one(in_shape[i]) and not is_one(out_shape[j]):
                i += 1
                continue
            if is_one(out_shape[j]):
                out.append(())
                j += 1
                if i < n_in and is_one(in_shape[i]):
                    i += 1
                continue
            # grow input group and output group until their products agree
            gi, go = [i], [j]
            pi, po = in_shape[i] if i < n_in else 1, out_shape[j]
            while not same(pi, po):
                if less(pi, po) and gi[-1] + 1 < n_in:
                    gi.append(gi[-1] + 1)
                    pi = pi * in_shape[gi[-1]]
                elif go[-1] + 1 < n_out:
                    go.append(go[-1] + 1)
                    po = po * out_shape[go[-1]]
                else:
                    break
            atoms = [a for k in gi if k < n_in for a in in_axes[k]]
            if len(go) == 1:
                out.append(tuple(atoms))
            else:
                parts = self._split(atoms, [out_shape[k] for k in go])
                out.extend(parts)
                if lost is not None:
                    kept = {self.find(a) for d in parts for a in d}
                    kept |= {self.find(f) for d in parts for a in d for g, lead in self.leads.items()
                             if self.find(g) == self.find(a) for f in lead}
                    lost.extend(k for k in gi if k < n_in and any(self.find(a) not in kept for a in in_axes[k]))
            i, j = gi[-1] + 1, go[-1] + 1
        return tuple(out)

    def _split(self, atoms: list, sizes: list) -> list:
        opened = self._open_leads(atoms)
        if opened is not None:
            exact = self._exact_split(opened, sizes)
            if exact is not None:
                return exact
        result = self._split_whole(atoms, sizes)
        first = next((j for j, s in enumerate(sizes) if not is_one(s)), None)
        if first is None or not atoms or result[first] == tuple(atoms[:len(result[first])]):
            return result
        s, head = sizes[first], self.find(atoms[0])
        lead = self._lead_of(head)
        if lead is not None and same(self._size_of(lead), s):
            result[first] = tuple(lead)  # the leading factor split off again
            return result
        whole, prod = [], 1
        for a in atoms:
            size = self.size[self.find(a)]
            # (symbolic sizes where they divide for every value: a dynamic batch merged with heads)
            if not (same(s % (prod * size), 0) and less(prod * size, s)):
                break
            whole.append(a)
            prod *= size
        if whole and len(whole) < len(atoms) and result[first]:
            self.leads[result[first][0]] = tuple(whole)
        return result

    def _lead_of(self, root: int):
        """The atoms of the leading factor recorded for the atom whose root is ``root``, or None."""
        return next((f for a, f in self.leads.items() if self.find(a) == root), None)

    def _open_leads(self, atoms: list):
        """``atoms`` with each atom that has a leading factor (``leads``) written as the factor's
        atoms then the rest (one atom per such atom, the same in every split), or None where no
        atom has one. A dim made of whole atoms and part of the next one (``[T, B, H x d]`` viewed
        as ``[T, B x H, d]``, as ``nn.MultiheadAttention`` lays out its heads) then splits again
        along the factor (``[T x B, H x d]``): the sequence keeps its axis."""
        out, opened = [], False
        for a in atoms:
            r = self.find(a)
            lead = self._lead_of(r)
            if lead is None:
                out.append(a)
                continue
            whole, part = self.size[r], self._size_of(lead)
            if not same(whole % part, 0):
                out.append(a)
                continue
            if r not in self.rests:
                rest = self.fresh(whole // part)
                self.rests[r] = rest[0] if rest else None
            out.extend(lead)
            if self.rests[r] is not None:
                out.append(self.rests[r])
            opened = True
        return out if opened else None

    def _exact_split(self, atoms: list, sizes: list):
        """``atoms`` handed out in order to dims of ``sizes``, each dim's product its size, every
        atom used; None where they do not divide so."""
        result, k = [], 0
        for s in sizes:
            group, prod = [], 1
            while k < len(atoms) and not same(prod, s):
                group.append(atoms[k])
                prod = prod * self.size[self.find(atoms[k])]
                k += 1
            if not same(prod, s):
                return None
            result.append(tuple(group))
        return result if k == len(atoms) else None

    def _size_of(self, atoms) -> object:
        prod = 1
        for a in atoms:
            prod = prod * self.size[self.find(a)]
        return prod

    def _split_whole(self, atoms: list, sizes: list) -> list:
        result, k = [], 0
        for s in sizes:
            if is_one(s):
                result.append(())
                continue
            group, prod = [], 1
            while k < len(atoms) and not same(prod, s):
                group.append(atoms[k])
                prod = prod * self.size[self.find(atoms[k])]
                k += 1
            result.append(tuple(group) if same(prod, s) else self.fresh(s))
        return result
