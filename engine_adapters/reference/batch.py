"""One forward pass's batch: flat token layout, attention groups, and compacted views.

Every token of a step is laid out flat (``[T, hidden]``) for the dense parts.  Attention
runs per *group* of sequences that feed the same number of tokens ``n`` this pass
(decode rows n=1, speculative verify rows n=G+1, a prefill chunk its own n): queries
``[B, heads, n, head_dim]`` against the keys and values gathered from the paged cache
(``kv_idx`` ``[B, L]`` slot indices, padded), with a boolean mask for causality and
padding.  Groups are laid out one after the other, rows in order, so a group's queries
are a contiguous slice of the flat layout.

A ``View`` is the subset of rows still running at a loop depth: in ``compact`` exit mode
rows whose tokens have all exited leave, and later loops run on the view's tokens only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class RowSpec:
    """One sequence's part of a pass: ``tokens`` fed at positions ``start..start+n-1``."""

    seq: Any
    tokens: list[int]
    start: int
    slots: np.ndarray
    """The sequence's slot index of every position (at least ``start + n`` long)."""
    out_local: list[int]
    """Indices (0..n-1) of the tokens whose next-token outputs are needed."""


@dataclass
class GroupView:
    """Rows feeding ``n`` tokens each, as laid out in one view."""

    n: int
    rows: np.ndarray
    """Global row ids, in layout order."""
    off: int
    """Offset of the group's first token in the view's flat layout."""
    kv_idx: Any
    """Tensor ``[B, L]`` of cache slots (padding points at slot 0 and is masked)."""
    mask: Any
    """Bool tensor ``[B, 1, n, L]`` (True = attend), or None when nothing is masked."""
    keys: int
    """Sum over the group's queries of keys attended (for the KV-read count)."""

    @property
    def B(self) -> int:
        """Rows in the group."""
        return len(self.rows)


@dataclass
class View:
    """The tokens and attention groups one loop pass runs on."""

    rows: np.ndarray
    """Global row ids in layout order."""
    tok_idx: Any
    """Tensor of flat token indices into the full layout (None: the full layout itself)."""
    T: int
    groups: list[GroupView]
    slot_map: Any
    cos: Any
    sin: Any
    keys: int
    """Keys attended by all queries of the view (per layer application)."""


class StepBatch:
    """The flat layout of one forward pass and its full view."""

    def __init__(self, specs: list[RowSpec], rope_cos: Any, rope_sin: Any, device: Any) -> None:
        import torch

        # group rows by n, keeping the given order inside a group; smaller n first
        order = sorted(range(len(specs)), key=lambda i: len(specs[i].tokens))
        self.specs = [specs[i] for i in order]
        R = len(self.specs)
        self.R = R
        ns = np.fromiter((len(s.tokens) for s in self.specs), dtype=np.int64, count=R)
        starts = np.fromiter((s.start for s in self.specs), dtype=np.int64, count=R)
        self.row_n = ns
        self.row_start = starts
        self.row_off = (
            np.concatenate(([0], np.cumsum(ns)[:-1])).astype(np.int64) if R else np.zeros(0, np.int64)
        )
        self.T = int(ns.sum())
        ids: list[int] = []
        for s in self.specs:
            ids.extend(s.tokens)
        pos = (
            np.concatenate([np.arange(s.start, s.start + len(s.tokens)) for s in self.specs])
            if R
            else np.zeros(0)
        )
        slot = (
            np.concatenate([s.slots[s.start : s.start + len(s.tokens)] for s in self.specs])
            if R
            else np.zeros(0)
        )
        self.device = device
        self.input_ids = torch.tensor(ids, dtype=torch.long).to(device)
        pos_t = torch.from_numpy(pos.astype(np.int64)).to(device)
        self.positions = pos
        self.slot_map = torch.from_numpy(slot.astype(np.int64)).to(device)
        self.cos = rope_cos.index_select(0, pos_t).unsqueeze(1)
        self.sin = rope_sin.index_select(0, pos_t).unsqueeze(1)
        # outputs
        out_flat: list[int] = []
        out_row: list[int] = []
        for r, s in enumerate(self.specs):
            off = int(self.row_off[r])
            for j in s.out_local:
                out_flat.append(off + j)
                out_row.append(r)
        self.out_flat = np.asarray(out_flat, dtype=np.int64)
        self.out_row = np.asarray(out_row, dtype=np.int64)
        self.out_flat_t = torch.from_numpy(self.out_flat).to(device)
        # a row may leave the batch (compact mode) only when every token in it is an output
        self.row_all_out = np.fromiter(
            (len(s.out_local) == len(s.tokens) for s in self.specs), dtype=bool, count=R
        )
        # groups
        self._groups: list[dict[str, Any]] = []
        r = 0
        while r < R:
            n = int(ns[r])
            e = r
            while e < R and ns[e] == n:
                e += 1
            rows = np.arange(r, e)
            st = starts[r:e]
            ctx = st + n
            L = int(ctx.max())
            kv = np.zeros((e - r, L), dtype=np.int64)
            for i, s in enumerate(self.specs[r:e]):
                c = int(ctx[i])
                kv[i, :c] = s.slots[:c]
            mask = None
            if n == 1:
                if not (ctx == L).all():
                    mask = (np.arange(L)[None, :] < ctx[:, None])[:, None, None, :]
            else:
                q_pos = st[:, None] + np.arange(n)[None, :]  # [B, n]
                mask = (np.arange(L)[None, None, :] <= q_pos[:, :, None])[:, None, :, :]
            keys_rows = n * st + n * (n + 1) // 2
            self._groups.append(
                {
                    "n": n,
                    "rows": rows,
                    "kv_idx": torch.from_numpy(kv).to(device),
                    "mask": torch.from_numpy(np.ascontiguousarray(mask)).to(device)
                    if mask is not None
                    else None,
                    "keys_rows": keys_rows,
                }
            )
            r = e
        self.row_keys = n_keys = np.zeros(R, dtype=np.int64)
        for g in self._groups:
            n_keys[g["rows"]] = g["keys_rows"]
        self.full = self._make_view(np.arange(R), full=True)

    def _make_view(self, rows: np.ndarray, full: bool = False) -> View:
        import torch

        groups: list[GroupView] = []
        off = 0
        keep_set = np.zeros(self.R, dtype=bool)
        keep_set[rows] = True
        for g in self._groups:
            grows = g["rows"]
            keep = keep_set[grows]
            if not keep.any():
                continue
            if keep.all():
                kv, mask, sel = g["kv_idx"], g["mask"], grows
            else:
                kt = torch.from_numpy(np.nonzero(keep)[0]).to(self.device)
                kv = g["kv_idx"].index_select(0, kt)
                mask = g["mask"].index_select(0, kt) if g["mask"] is not None else None
                sel = grows[keep]
            groups.append(GroupView(g["n"], sel, off, kv, mask, int(self.row_keys[sel].sum())))
            off += len(sel) * g["n"]
        layout = np.concatenate([gv.rows for gv in groups]) if groups else np.zeros(0, np.int64)
        keys = sum(gv.keys for gv in groups)
        if full:
            return View(layout, None, self.T, groups, self.slot_map, self.cos, self.sin, keys)
        if len(layout) == 0:
            empty = torch.zeros(0, dtype=torch.long, device=self.device)
            return View(layout, empty, 0, [], empty, self.cos[:0], self.sin[:0], 0)
        tok = self.row_tokens(layout)
        tok_t = torch.from_numpy(tok.astype(np.int64)).to(self.device)
        return View(
            layout, tok_t, len(tok), groups, self.slot_map.index_select(0, tok_t),
            self.cos.index_select(0, tok_t), self.sin.index_select(0, tok_t), keys,
        )  # fmt: skip

    def view(self, rows: np.ndarray) -> View:
        """The view of the given global rows (layout order kept)."""
        if len(rows) == self.R:
            return self.full
        return self._make_view(np.sort(rows))

    def local_index(self, view: View, flat: np.ndarray) -> np.ndarray:
        """Positions in ``view``'s layout of full-layout token indices ``flat`` (all in view)."""
        if view.tok_idx is None:
            return flat
        pos = np.full(self.T, -1, dtype=np.int64)
        tok = self.row_tokens(view.rows)
        pos[tok] = np.arange(len(tok))
        return pos[flat]

    def row_tokens(self, rows: np.ndarray) -> np.ndarray:
        """Full-layout token indices of ``rows``, in order."""
        if len(rows) == 0:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([np.arange(self.row_off[r], self.row_off[r] + self.row_n[r]) for r in rows])
