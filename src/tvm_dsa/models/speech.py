"""Conformer block (Gulati et al. 2020), inference form (no dropout).

The MHSA module is plain multi-head self-attention: the paper's Transformer-XL relative
positional encoding is *not* modelled.
"""

from __future__ import annotations

import numpy as np
import onnx

from tvm_dsa.models.builder import GraphBuilder


def _half_ffn(b: GraphBuilder, x: str, d: int, expansion: int, name: str) -> str:
    """x + 0.5 * (Linear(Swish(Linear(LayerNorm(x)))))."""
    with b.scope(name):
        y = b.layernorm(x, d, name="layer_norm")
        y = b.swish(b.linear(y, d, d * expansion, gain=2.0, name="linear1"))
        y = b.linear(y, d * expansion, d, name="linear2")
        return b.add(x, b.scale(y, 0.5))


def _conv_module(b: GraphBuilder, x: str, d: int, kernel: int) -> str:
    """x + Transpose(PW-Conv(Swish(BN(DW-Conv(GLU(PW-Conv(Transpose(LayerNorm(x)))))))))."""
    with b.scope("conv_module"):
        y = b.layernorm(x, d, name="layer_norm")
        y = b.transpose(y, [0, 2, 1])                                              # [B, D, T]
        y = b.conv(y, d, 2 * d, (1,), bias=True, gain=1.0, name="pointwise_conv1")
        with b.scope("glu"):
            a, g = b.op("Split", [y, b.const(np.array([d, d], np.int64), "split")],
                        outputs=2, axis=1)
            y = b.mul(a, b.sigmoid(g))
        y = b.conv(y, d, d, (kernel,), padding=kernel // 2, groups=d, bias=True,
                   name="depthwise_conv")
        y = b.swish(b.batchnorm(y, d, name="batch_norm"))
        y = b.conv(y, d, d, (1,), bias=True, gain=1.0, name="pointwise_conv2")
        return b.add(x, b.transpose(y, [0, 2, 1]))


def conformer(batch: int = 1, seq: int = 128, dim: int = 256, heads: int = 4,
              ffn_expansion: int = 4, kernel: int = 31, blocks: int = 1,
              seed: int = 0) -> onnx.ModelProto:
    """``blocks`` Conformer blocks on input ``input`` [B, T, D]; output ``output`` [B, T, D]."""
    if kernel % 2 == 0:
        raise ValueError("the depthwise kernel must be odd ('same' padding)")
    cfg = dict(batch=batch, seq=seq, dim=dim, heads=heads, ffn_expansion=ffn_expansion,
               kernel=kernel, blocks=blocks, seed=seed)
    b = GraphBuilder("conformer", seed)
    x = b.input("input", [batch, seq, dim])
    for i in range(blocks):
        with b.scope(f"block{i}"):
            x = _half_ffn(b, x, dim, ffn_expansion, "ffn1")
            with b.scope("mhsa"):
                y = b.layernorm(x, dim, name="layer_norm")
                x = b.add(x, b.attention(y, batch, seq, dim, heads))
            x = _conv_module(b, x, dim, kernel)
            x = _half_ffn(b, x, dim, ffn_expansion, "ffn2")
            x = b.layernorm(x, dim, name="final_layer_norm")
    b.output(x, "output")
    return b.build(cfg)
