"""ExactPoolDivisor: an average pooling that counts only the real inputs of each window becomes
one that counts the padding too, scaled by a constant.

ONNX's AveragePool defaults to ``count_include_pad=0``: at the border a window's divisor is the
number of inputs it covers, which varies with the output index (a value the DSA's vector units
cannot take from an affine access). With ``count_include_pad`` the divisor is the window's area
everywhere, so ``avg_pool(x, pad excluded) = avg_pool(x, pad included) * area / covered``, the
factor a constant per output pixel that the pooling's kernel reads like a bias. 2-d, NCHW,
dilation 1, floor mode; other poolings are left as they are.

    mod = ExactPoolDivisor(mod)   # before legalization
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_dsa.relax_passes.fold import static_shape
from tvm_dsa.relax_passes.rewrite import rewrite_functions

_AVG_POOL2D = tvm.ir.Op.get("relax.nn.avg_pool2d")


def covered(size: int, out: int, kernel: int, stride: int, pad_before: int) -> np.ndarray:
    """How many of each output's ``kernel`` window positions fall on the ``size`` inputs."""
    start = np.arange(out) * stride - pad_before
    return np.minimum(start + kernel, size) - np.maximum(start, 0)


@relax.expr_functor.mutator
class _Exact(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(_AVG_POOL2D):
            return call
        a = call.attrs
        shape, out = static_shape(call.args[0].ty), static_shape(call.ty)
        if (a.count_include_pad or not any(int(p) for p in a.padding) or a.ceil_mode or str(a.layout) != "NCHW"
                or any(int(d) != 1 for d in a.dilation) or shape is None or out is None):
            return call
        (kh, kw), (sh, sw), (top, left, _, _) = (tuple(int(v) for v in t) for t in (a.pool_size, a.strides, a.padding))
        rows = covered(shape[2], out[2], kh, sh, top)
        cols = covered(shape[3], out[3], kw, sw, left)
        factor = (kh * kw / np.outer(rows, cols)).astype(str(call.ty.dtype))[None, None]
        pooled = relax.op.nn.avg_pool2d(call.args[0], a.pool_size, a.strides, a.padding, a.dilation, a.ceil_mode,
                                        True, str(a.layout), str(a.out_layout))
        return relax.op.multiply(self.builder_.emit(pooled), relax.const(factor))


@tvm.transform.module_pass(opt_level=0, name="dsa.ExactPoolDivisor")
def ExactPoolDivisor(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    return rewrite_functions(mod, _Exact)
