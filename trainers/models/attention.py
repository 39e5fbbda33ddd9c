"""Causal self-attention implementations as plain PyTorch functions ``(q, k, v) -> out``.

Every function takes ``q``, ``k`` and ``v`` of the same shape ``(batch, heads, seq, head_dim)``
and returns ``out`` of that shape and dtype; query ``i`` attends to keys ``j <= i`` (the
sliding window further to ``j > i - window``). Heads are independent, so the functions run
unchanged on the local heads of a tensor-parallel shard.

==================  =====================================  ==================================
name                computes                               extra memory (fwd + bwd, per head)
==================  =====================================  ==================================
``sdpa``            ``F.scaled_dot_product_attention``     the backend's (CPU / flash: O(seq))
``naive``           softmax(q k^T / sqrt(d) + mask) v      O(seq^2): the score matrix, saved
``tiled``           the same, flash-style in blocks        O(seq x head_dim + block^2)
``sliding_window``  the same over the last ``window`` keys  O(seq x (window + block))
``linear``          elu+1 feature-map linear attention     O(seq x chunk + seq/chunk x d^2)
==================  =====================================  ==================================

``naive``, ``tiled`` and ``sdpa`` compute the same function (``tiled`` and ``naive`` agree with
``sdpa`` to rounding); ``sliding_window`` equals them when ``window >= seq``; ``linear`` is a
different model (Katharopoulos et al., 2020). ``tiled``, ``sliding_window`` and ``linear``
compute in fp32 whatever the input dtype (autocast is switched off inside) and return the input
dtype; ``naive`` runs its ops as written, under autocast if it is on. Only ``sdpa`` applies
attention dropout.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

# Block sizes of the blockwise implementations: big enough that the Python loop over blocks
# costs little next to the tile arithmetic, small enough that a tile of scores stays small
# (256 x 256 fp32 is 256 KiB per head; on 2 CPU cores 256 ran fastest of 128, 256 and 512).
TILE = 256  # tiled: query rows and key columns per block
WINDOW_BLOCK = 128  # sliding_window: query rows per block
CHUNK = 64  # linear: positions per chunk


def _check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    if q.dim() != 4 or q.shape != k.shape or q.shape != v.shape:
        raise ValueError("q, k and v must share one (batch, heads, seq, head_dim) shape; got "
                         f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")


def _causal_mask(rows: torch.Tensor, cols: torch.Tensor, window: int | None = None
                 ) -> torch.Tensor:
    """True where query position ``rows[i]`` may not see key position ``cols[j]``."""
    hidden = cols[None, :] > rows[:, None]
    if window is not None:
        hidden |= cols[None, :] <= rows[:, None] - window
    return hidden


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
         dropout_p: float = 0.0) -> torch.Tensor:
    """``F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)``.

    PyTorch picks the kernel (flash, memory-efficient, cuDNN or the math fallback); the
    model's default, and the only implementation with attention dropout.
    """
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p)


def document_mask(positions: torch.Tensor) -> torch.Tensor:
    """``(batch, 1, seq, seq)``, True where a query may see a key, for packed samples whose
    ``positions`` ``(batch, seq)`` restart at 0 where each sample starts: causal, and only
    within the query's own sample."""
    document = (positions == 0).cumsum(dim=1)
    seq = positions.shape[1]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=positions.device).tril()
    return (causal & (document[:, :, None] == document[:, None, :]))[:, None]


def packed_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
                dropout_p: float = 0.0) -> torch.Tensor:
    """:func:`sdpa` of packed samples: no query sees a key of another sample
    (:func:`document_mask`). The only implementation packed samples run on."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=document_mask(positions),
                                          dropout_p=dropout_p)


def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The textbook formula with the whole ``(seq, seq)`` score matrix materialised.

    ``softmax(q k^T / sqrt(head_dim)`` with future keys at -inf``) v``; autograd saves the
    probabilities, so forward and backward hold a few ``batch x heads x seq^2`` tensors.
    """
    _check_qkv(q, k, v)
    seq = q.shape[-2]
    positions = torch.arange(seq, device=q.device)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(_causal_mask(positions, positions), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class _TiledAttention(torch.autograd.Function):
    """Flash-style causal attention (FlashAttention-2's algorithm) in plain PyTorch.

    Forward: for each block of ``block`` query rows, walk the key/value blocks up to the
    diagonal keeping a running row max ``m``, running sum ``l`` of ``exp(s - m)`` and the
    un-normalised output, rescaled whenever ``m`` grows; save only ``out`` and the row
    log-sum-exp ``lse = m + log(l)``. Backward: for each key/value block, recompute the
    probabilities ``p = exp(s - lse)`` of every query block at or below the diagonal and
    accumulate ``dv += p^T do``, ``ds = p * (do v^T - rowsum(do * out))``, ``dq += ds k``,
    ``dk += ds^T q``. Beyond the ``(seq, head_dim)`` inputs, outputs and gradients, at most two
    ``block x block`` tiles per head are alive at a time (the tile ops work in place).
    """

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                block: int) -> torch.Tensor:
        seq, head_dim = q.shape[-2:]
        scale = 1.0 / math.sqrt(head_dim)
        positions = torch.arange(seq, device=q.device)
        out = torch.empty_like(q)
        lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
        with torch.autocast(q.device.type, enabled=False):
            for i0 in range(0, seq, block):
                i1 = min(i0 + block, seq)
                qi = q[..., i0:i1, :].float() * scale
                row_max = torch.full(qi.shape[:-1], float("-inf"), device=q.device)
                row_sum = torch.zeros(qi.shape[:-1], device=q.device)
                acc = torch.zeros_like(qi)
                for j0 in range(0, i1, block):  # key blocks up to the diagonal
                    j1 = min(j0 + block, seq)
                    s = qi @ k[..., j0:j1, :].float().transpose(-2, -1)
                    if j1 > i0 + 1:  # the block reaches past the first row's diagonal
                        s.masked_fill_(_causal_mask(positions[i0:i1], positions[j0:j1]),
                                       float("-inf"))
                    new_max = torch.maximum(row_max, s.amax(dim=-1))
                    p = s.sub_(new_max[..., None]).exp_()  # in place: one tile alive
                    rescale = torch.exp(row_max - new_max)
                    row_sum.mul_(rescale).add_(p.sum(dim=-1))
                    acc.mul_(rescale[..., None]).add_(p @ v[..., j0:j1, :].float())
                    row_max = new_max
                out[..., i0:i1, :] = acc / row_sum[..., None]
                lse[..., i0:i1] = row_max + torch.log(row_sum)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.block = block
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad_out: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
        q, k, v, out, lse = ctx.saved_tensors
        block = ctx.block
        seq, head_dim = q.shape[-2:]
        scale = 1.0 / math.sqrt(head_dim)
        positions = torch.arange(seq, device=q.device)
        with torch.autocast(q.device.type, enabled=False):
            # rowsum(do * out) = rowsum(do * (p v)) = rowsum(p * (do v^T)): the softmax
            # Jacobian's correction term, per query row.
            delta = (grad_out.float() * out.float()).sum(dim=-1)
            dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
            dk = torch.zeros_like(dq)
            dv = torch.zeros_like(dq)
            for j0 in range(0, seq, block):
                j1 = min(j0 + block, seq)
                kj, vj = k[..., j0:j1, :].float(), v[..., j0:j1, :].float()
                for i0 in range(j0, seq, block):  # query blocks from the diagonal down
                    i1 = min(i0 + block, seq)
                    qi, doi = q[..., i0:i1, :].float(), grad_out[..., i0:i1, :].float()
                    s = (qi * scale) @ kj.transpose(-2, -1)
                    if j1 > i0 + 1:
                        s.masked_fill_(_causal_mask(positions[i0:i1], positions[j0:j1]),
                                       float("-inf"))
                    p = s.sub_(lse[..., i0:i1, None]).exp_()
                    dv[..., j0:j1, :] += p.transpose(-2, -1) @ doi
                    # ds = p * (dp - delta) with dp = do v^T, in dp's storage: two tiles alive.
                    ds = (doi @ vj.transpose(-2, -1)).sub_(delta[..., i0:i1, None]).mul_(p)
                    dq[..., i0:i1, :] += (ds @ kj) * scale
                    dk[..., j0:j1, :] += (ds.transpose(-2, -1) @ qi) * scale
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None


def tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block: int = TILE) -> torch.Tensor:
    """Exact causal attention without the score matrix, forward and backward.

    Equals :func:`naive` to fp32 rounding (gradients included) for any ``seq``, divisible by
    ``block`` or not; memory beyond the inputs is ``out``, the gradients, an fp32 row
    log-sum-exp and a few ``block x block`` tiles per head. See :class:`_TiledAttention`.
    """
    _check_qkv(q, k, v)
    if block < 1:
        raise ValueError(f"block must be positive, got {block}")
    return _TiledAttention.apply(q, k, v, block)


def sliding_window(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int,
                   block: int = WINDOW_BLOCK) -> torch.Tensor:
    """Local causal attention: query ``i`` attends to keys ``i - window < j <= i``.

    ``window`` counts the query's own key, so ``window >= seq`` is full causal attention and
    ``window = 1`` returns ``v``. Computed per block of ``block`` query rows against the
    ``block + window - 1`` keys that block can see; autograd saves those band tiles, so memory
    is ``O(seq x (window + block))`` per head, never ``seq^2``.
    """
    _check_qkv(q, k, v)
    if window < 1 or block < 1:
        raise ValueError(f"window and block must be positive, got {window} and {block}")
    seq, head_dim = q.shape[-2:]
    positions = torch.arange(seq, device=q.device)
    with torch.autocast(q.device.type, enabled=False):
        qf, kf, vf = q.float() / math.sqrt(head_dim), k.float(), v.float()
        outs = []
        for i0 in range(0, seq, block):
            i1 = min(i0 + block, seq)
            j0 = max(0, i0 - window + 1)
            s = qf[..., i0:i1, :] @ kf[..., j0:i1, :].transpose(-2, -1)
            s = s.masked_fill(_causal_mask(positions[i0:i1], positions[j0:i1], window),
                              float("-inf"))
            outs.append(torch.softmax(s, dim=-1) @ vf[..., j0:i1, :])
        return torch.cat(outs, dim=-2).to(q.dtype)


def linear(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int = CHUNK
           ) -> torch.Tensor:
    """Causal linear attention with the feature map ``phi(x) = elu(x) + 1``.

    ``out_i = phi(q_i) S_i / (phi(q_i) . z_i)`` with ``S_i = sum_{j<=i} phi(k_j) v_j^T`` and
    ``z_i = sum_{j<=i} phi(k_j)`` (Katharopoulos et al., 2020; no 1/sqrt(d) scale). Computed
    in chunks of ``chunk`` positions: within a chunk the masked quadratic form, across chunks
    the running ``(head_dim, head_dim)`` state ``S`` and ``z``. Memory ``O(seq x chunk +
    seq / chunk x head_dim^2)`` per head; time linear in ``seq``.
    """
    _check_qkv(q, k, v)
    if chunk < 1:
        raise ValueError(f"chunk must be positive, got {chunk}")
    seq = q.shape[-2]
    positions = torch.arange(seq, device=q.device)
    with torch.autocast(q.device.type, enabled=False):
        fq, fk, vf = F.elu(q.float()) + 1, F.elu(k.float()) + 1, v.float()
        state = fq.new_zeros(*q.shape[:-2], q.shape[-1], v.shape[-1])  # S: sum phi(k) v^T
        norm = fq.new_zeros(*q.shape[:-2], q.shape[-1])  # z: sum phi(k)
        outs = []
        for c0 in range(0, seq, chunk):
            c1 = min(c0 + chunk, seq)
            qc, kc, vc = fq[..., c0:c1, :], fk[..., c0:c1, :], vf[..., c0:c1, :]
            a = (qc @ kc.transpose(-2, -1)).masked_fill(
                _causal_mask(positions[c0:c1], positions[c0:c1]), 0.0)
            numerator = qc @ state + a @ vc
            denominator = qc @ norm[..., None] + a.sum(dim=-1, keepdim=True)
            outs.append(numerator / denominator)
            state = state + kc.transpose(-2, -1) @ vc
            norm = norm + kc.sum(dim=-2)
        return torch.cat(outs, dim=-2).to(q.dtype)


ATTENTIONS: tuple[str, ...] = ("sdpa", "naive", "tiled", "sliding_window", "linear")


def attention_fn(name: str, window: int) -> AttentionFn:
    """The implementation called ``name`` as ``(q, k, v) -> out`` (``window``: sliding_window's).

    ``sdpa`` is returned without dropout; call :func:`sdpa` with ``dropout_p`` for that.
    Raises ValueError for an unknown name or a window < 1.
    """
    if window < 1:
        raise ValueError(f"attention window must be positive, got {window}")
    table: dict[str, AttentionFn] = {
        "sdpa": sdpa, "naive": naive, "tiled": tiled, "linear": linear,
        "sliding_window": functools.partial(sliding_window, window=window),
    }
    if name not in table:
        raise ValueError(f"unknown attention {name!r}; choose one of {', '.join(ATTENTIONS)}")
    return table[name]
