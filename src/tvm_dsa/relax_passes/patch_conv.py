"""PatchConvAsMatmul: a convolution whose stride is its kernel (a ViT's patch embedding) becomes a
1 x 1 convolution of the image's patches, a matmul over all of its reduction.

Such a convolution reads each input pixel once, and its reduction (channels x kernel rows x kernel
columns: 3 x 16 x 16 for ViT-B/16) is chunked by the DSA's tiling along its first loop only, the
3 channels: a weight chunk holds all 256 taps of a channel, so a tile holds few output channels
and every tile loads its image rows again (ViT-B/16 at batch 8: 78 MB read from DDR for a 2.4 MB
image, 758,780 cycles for 0.9 G MACs). As patches (space to depth) the same value reduces over
one loop of 768 that the tiling chunks freely:

    x (N, C, Ho kh, Wo kw) -> (N, C, Ho, kh, Wo, kw) -> (N, C, kh, kw, Ho, Wo) -> (N, C kh kw, Ho, Wo)
    y = conv2d(patches, W.reshape(O, C kh kw, 1, 1))  -> (N, O, Ho, Wo)

The output is the convolution's, in its layout, so what reads it fuses as before (ViT's bias,
tokens, class token and position embedding; a matmul's (N, Ho Wo, O) transposed back and fused
with those had indices the DSA cannot tile, and that kernel ran on the host).

NCHW / OIHW, groups 1, dilation 1, no padding, a kernel larger than 1 x 1 that tiles the input
exactly, constant weights, static shapes; others are kept.

    mod = PatchConvAsMatmul(mod)   # before legalization
"""

from __future__ import annotations

import tvm
from tvm import relax

from tvm_dsa.relax_passes.fold import constant_value, static_shape
from tvm_dsa.relax_passes.rewrite import rewrite_functions

_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")


@relax.expr_functor.mutator
class _OfPatches(relax.PyExprMutator):
    def visit_call_(self, call):
        call = super().visit_call_(call)
        if not call.op.same_as(_CONV2D):
            return call
        a, x = call.attrs, call.args[0]
        w, shape = constant_value(call.args[1]), static_shape(x.ty)
        if (w is None or shape is None or str(a.data_layout) != "NCHW" or str(a.kernel_layout) != "OIHW"
                or str(a.out_layout) != "NCHW" or int(a.groups) != 1 or any(int(d) != 1 for d in a.dilation)
                or any(int(p) for p in a.padding)):
            return call
        n, c, h, wd = shape
        o, _, kh, kw = w.shape
        if (tuple(int(s) for s in a.strides) != (kh, kw) or kh * kw == 1 or h % kh or wd % kw):
            return call
        ho, wo = h // kh, wd // kw
        emit = self.builder_.emit
        patches = emit(relax.op.reshape(x, (n, c, ho, kh, wo, kw)))
        patches = emit(relax.op.permute_dims(patches, [0, 1, 3, 5, 2, 4]))
        patches = emit(relax.op.reshape(patches, (n, c * kh * kw, ho, wo)))
        weights = relax.const(w.reshape(o, c * kh * kw, 1, 1).astype(str(call.args[1].ty.dtype)))
        return relax.op.nn.conv2d(patches, weights, out_dtype=str(a.out_dtype) if a.out_dtype else None)


@tvm.transform.module_pass(opt_level=0, name="dsa.PatchConvAsMatmul")
def PatchConvAsMatmul(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    return rewrite_functions(mod, _OfPatches)
