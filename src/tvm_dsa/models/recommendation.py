"""DLRM (Naumov et al. 2019) with dot-product feature interaction."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
import onnx

from tvm_dsa.models.builder import GraphBuilder


def interaction_indices(n: int) -> np.ndarray:
    """Flat indices of the strictly lower triangle of an n x n matrix, in DLRM's order
    (``li, lj = [i for i in range(n) for j in range(i)], [j ...]``, i.e. the default
    ``arch_interaction_itself=False``: no self-interaction)."""
    return np.array([i * n + j for i in range(n) for j in range(i)], np.int64)


def dlrm(batch: int = 1, num_dense: int = 13, bottom_mlp: Sequence[int] = (512, 256, 64),
         top_mlp: Sequence[int] = (512, 256, 1), tables: int | Sequence[int] = (1000,) * 8,
         seed: int = 0) -> onnx.ModelProto:
    """DLRM. Inputs ``dense`` float32 [B, num_dense] and ``sparse`` int64 [B, T] (one index
    per table per sample); output ``prob`` float32 [B, top_mlp[-1]] after a Sigmoid.

    ``tables`` is a list of table sizes (or a count, of 1000-row tables); the embedding
    dimension is ``bottom_mlp[-1]``. The interaction stacks the bottom-MLP output and the
    T embeddings into Z [B, 1+T, d], forms Z @ Z^T, flattens it and keeps the strictly
    lower triangle with a constant Gather (C(1+T, 2) features), then concatenates the
    bottom-MLP output in front of it."""
    if isinstance(tables, int):
        tables = (1000,) * tables
    tables = [int(t) for t in tables]
    bottom_mlp, top_mlp = list(bottom_mlp), list(top_mlp)
    cfg = dict(batch=batch, num_dense=num_dense, bottom_mlp=bottom_mlp, top_mlp=top_mlp,
               tables=tables, seed=seed)
    d, t = bottom_mlp[-1], len(tables)
    n = t + 1
    b = GraphBuilder("dlrm", seed)
    dense = b.input("dense", [batch, num_dense])
    sparse = b.input("sparse", [batch, t], np.int64, value_range=(0, tables))

    x = b.mlp(dense, [num_dense, *bottom_mlp], final_act=True, name="bot_l")    # [B, d]
    # Post-ReLU features have E[x^2] ~ 1/2; embeddings N(0, 1/sqrt(d)) keep the dot
    # products (sums of d products) at O(1).
    emb_std = 1.0 / math.sqrt(math.sqrt(d))
    vecs = [b.reshape(x, [batch, 1, d])]
    for i, rows in enumerate(tables):
        with b.scope(f"emb_l.{i}"):
            idx = b.gather(sparse, np.int64(i), axis=1)                            # [B]
            e = b.gather(b.param("weight", [rows, d], emb_std), idx)               # [B, d]
            vecs.append(b.reshape(e, [batch, 1, d]))
    with b.scope("interact"):
        z = b.concat(vecs, axis=1)                                                  # [B, n, d]
        zz = b.op("MatMul", [z, b.transpose(z, [0, 2, 1])])                         # [B, n, n]
        zflat = b.gather(b.reshape(zz, [batch, n * n]), interaction_indices(n), axis=1)
        r = b.concat([x, zflat], axis=1)                                            # [B, d+C]
    y = b.mlp(r, [d + n * (n - 1) // 2, *top_mlp], name="top_l")
    b.output(b.sigmoid(y), "prob")
    return b.build(cfg)
