"""The step both attention kernels share: fold one tile of keys into a running softmax.

Legend: M = query rows of the program, N = keys of the tile, D = padded head dim.
State per row: m (running max of the scaled scores, log2 domain), l (running sum of
exp2(score - m)) and acc (running sum of exp2(score - m) * v). After the last tile
the row's output is acc / l and its log-sum-exp (log2 domain) is m + log2(l).

Scores are q k^T * qk_scale with qk_scale = softmax scale * log2(e), so exp2 gives
the natural exponential of the scaled score with one multiply folded into the scale.
NOTE: a row must see at least one visible key in its first tile (m = -inf and no
visible key would give exp2(-inf - -inf) = NaN); both kernels order tiles so that
the first tile of a row holds key 0 or a key below the row's sequence length.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def attend_tile(
    q,  # [M, D] DOT_DTYPE
    k,  # [N, D] DOT_DTYPE
    v,  # [N, D] DOT_DTYPE; invisible keys must hold finite values (load them with other=0)
    visible,  # [M, N] or [1, N] bool, or a scalar True when HAS_MASK is False
    acc,  # [M, D] fp32
    m_i,  # [M] fp32
    l_i,  # [M] fp32
    qk_scale,
    HAS_MASK: tl.constexpr,
    MAY_BE_EMPTY: tl.constexpr,  # a row may see no key of this tile while it has seen none before (sliding windows)
    DOT_DTYPE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)  # [M, N] fp32, not yet scaled
    if HAS_MASK:
        scores = tl.where(visible, scores, float("-inf"))
    # NOTE: the scale is applied inside the exponent (one FMA per score) and to the row
    # max only, instead of a separate multiply over the whole tile (qk_scale > 0, so the
    # max commutes with it and -inf stays -inf)
    m_new = tl.maximum(m_i, tl.max(scores, axis=1) * qk_scale)
    m_use = m_new
    if MAY_BE_EMPTY:  # m = -inf so far: exponents against 0 leave p, alpha, l and acc at 0, not NaN
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(scores * qk_scale - m_use[:, None])
    alpha = tl.exp2(m_i - m_use)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    acc = tl.dot(p.to(DOT_DTYPE), v, acc * alpha[:, None], input_precision=DOT_PRECISION)
    return acc, m_new, l_i
