"""ConvTransposeAsConv: a transposed convolution with constant weights becomes a convolution of
the input with zeros inserted between its pixels.

TOPI's ``conv2d_transpose`` dilates its input by the stride with ``i % s == 0`` tests and walks
its weights backwards: neither is an affine access, so every ConvTranspose ran on the host. The
same value as the DSA computes it: ``x`` (N, C, H, W) gets ``s - 1`` zeros after each pixel (a
view as (N, C, H, 1, W, 1), padded with zeros to (N, C, H, s, W, s), a view as (N, C, H s, W s);
the pad is a copy with index bounds), then an ordinary convolution with the weights flipped and
their in/out channels swapped (in numpy, once), padded by ``k - 1 - pad`` (plus the output
padding, less the trailing zeros; where that is negative, by 0 and its output cropped). NCHW / IOHW, dilation 1, constant weights; others are kept.

    mod = ConvTransposeAsConv(mod)   # before legalization
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_dsa.relax_passes.fold import constant_value, static_shape
from tvm_dsa.relax_passes.rewrite import rewrite_functions

_CONV2D_TRANSPOSE = tvm.ir.Op.get("relax.nn.conv2d_transpose")


def flipped_weights(w: np.ndarray, groups: int) -> np.ndarray:
    """IOHW transposed-convolution weights (I, O / g, kh, kw) as OIHW convolution weights
    (O, I / g, kh, kw), each kernel turned by 180 degrees."""
    i, og, kh, kw = w.shape
    w = w.reshape(groups, i // groups, og, kh, kw).transpose(0, 2, 1, 3, 4)  # g, O/g, I/g, kh, kw
    return np.ascontiguousarray(w.reshape(groups * og, i // groups, kh, kw)[:, :, ::-1, ::-1])


def _inserted(kernel: int, stride: int, pad_before: int, pad_after: int) -> tuple[bool, tuple[int, int]]:
    """(zeros before each pixel?, the convolution's pads before and after) along one dim: the
    dilated input of H pixels is H s long, its s - 1 zeros after each pixel or before it."""
    after = (kernel - 1 - pad_before, kernel - 1 - pad_after - (stride - 1))
    before = (kernel - 1 - pad_before - (stride - 1), kernel - 1 - pad_after)
    return (True, before) if min(after) < 0 <= min(before) else (False, after)


@relax.expr_functor.mutator
class _AsConv(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(_CONV2D_TRANSPOSE):
            return call
        a = call.attrs
        w, shape = constant_value(call.args[1]), static_shape(call.args[0].ty)
        if (w is None or shape is None or str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "IOHW"
                or str(a.out_layout) != "NCHW" or any(int(d) != 1 for d in a.dilation)):
            return call
        (sh, sw), (top, left, bottom, right), (oh, ow) = (
            tuple(int(v) for v in t) for t in (a.strides, a.padding, a.output_padding))
        n, c, h, wd = shape
        kh, kw = w.shape[2:]
        # per spatial dim, the s - 1 zeros go after each pixel (the last s - 1 rows zeros) or,
        # where that would ask for a negative pad at the end, before it
        (lead_h, (top_pad, bottom_pad)), (lead_w, (left_pad, right_pad)) = (
            _inserted(kh, sh, top, bottom - oh), _inserted(kw, sw, left, right - ow))
        x = call.args[0]
        if sh > 1 or sw > 1:
            zeros_h = (sh - 1, 0) if lead_h else (0, sh - 1)
            zeros_w = (sw - 1, 0) if lead_w else (0, sw - 1)
            x = self.builder_.emit(relax.op.reshape(x, (n, c, h, 1, wd, 1)))
            x = self.builder_.emit(relax.op.nn.pad(x, (0, 0, 0, 0, 0, 0, *zeros_h, 0, 0, *zeros_w)))
            x = self.builder_.emit(relax.op.reshape(x, (n, c, h * sh, wd * sw)))
        pads = [top_pad, left_pad, bottom_pad, right_pad]
        weights = relax.const(flipped_weights(w, int(a.groups)).astype(str(call.args[1].ty.dtype)))
        conv = relax.op.nn.conv2d(x, weights, padding=[max(p, 0) for p in pads], groups=int(a.groups),
                                  out_dtype=str(a.out_dtype) if a.out_dtype else None)
        if min(pads) >= 0:
            return conv
        # a negative pad removes rows (the inserted zeros, or data the ConvTranspose's pads drop):
        # the convolution padded by 0 there, its output cropped
        out = call.ty.shape
        begin = [max(-pads[0], 0), max(-pads[1], 0)]
        return relax.op.strided_slice(self.builder_.emit(conv), [2, 3], begin,
                                      [begin[0] + int(out[2]), begin[1] + int(out[3])])


@tvm.transform.module_pass(opt_level=0, name="dsa.ConvTransposeAsConv")
def ConvTransposeAsConv(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    return rewrite_functions(mod, _AsConv)
