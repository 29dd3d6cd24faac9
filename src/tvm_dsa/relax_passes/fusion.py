"""The fusion the DSA pipeline (and the tuning's task extraction) runs before scheduling: ``fuse``."""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.backend import cpu_generic

from tvm_dsa.kernelgen.symbolic import is_dynamic
from tvm_dsa.relax_passes.concat import ConcatApart
from tvm_dsa.relax_passes.conv_transpose import ConvTransposeAsConv
from tvm_dsa.relax_passes.patch_conv import PatchConvAsMatmul
from tvm_dsa.relax_passes.gather import GatherOfRangeAsSlice
from tvm_dsa.relax_passes.pool_divisor import ExactPoolDivisor
from tvm_dsa.relax_passes.quantized import IntegerQDQ
from tvm_dsa.relax_passes.rdp_apply import ApplyRDP
from tvm_dsa.relax_passes.rdp_fusion import AnnotateSymbolicReshapes
from tvm_dsa.relax_passes.scale_apart import ScaleApart
from tvm_dsa.relax_passes.simplify import ClampAsClip, SimplifyInference
from tvm_dsa.relax_passes.transpose import CancelTransposePairs
from tvm_dsa.relax_passes.wide import KeepWide
from tvm_dsa.tir_passes.inline import InlineMasks, InlineProducts
from tvm_dsa.tir_passes.names import UniqueBufferNames


def fuse(mod: tvm.IRModule, rdp_fusion: bool = True) -> tvm.IRModule:
    """The module as the offload sees it (in the current target's scope): a QDQ model's quantized
    layers made integer computations (``IntegerQDQ``), simplified (with clamps between
    constants made clips: ``ClampAsClip``, transposes around a softmax cancelled, gathers at a
    range of indices sliced, an average pooling that excludes the padding made one that counts
    it, times a constant:
    ``ExactPoolDivisor``, a transposed convolution a convolution: ``ConvTransposeAsConv``, a
    convolution whose stride is its kernel a matmul of patches: ``PatchConvAsMatmul``),
    legalized and fused (a concatenation of two values of one tensor left unfused:
    ``ConcatApart``; a per-channel vector of a run-time scalar too: ``ScaleApart``), each
    PrimFunc's buffers named uniquely (``UniqueBufferNames``), its bool masks inlined into
    their readers (``InlineMasks``) and its products into the sums that alone read them
    (``InlineProducts``), the tensors whose values can leave the
    chip's storage type marked to stay wide (``KeepWide``); a dynamic model with RDP's shapes
    applied, and fused across its dynamic shapes unless ``rdp_fusion`` is False."""
    host = tvm.target.Target.current(allow_none=True) or tvm.target.Target("llvm")
    dynamic = is_dynamic(mod)
    across = dynamic and rdp_fusion
    return tvm.transform.Sequential(
        ([ApplyRDP()] if dynamic else [])
        + [IntegerQDQ, SimplifyInference(), ClampAsClip, PatchConvAsMatmul, CancelTransposePairs, GatherOfRangeAsSlice,
           ExactPoolDivisor, ConvTransposeAsConv]
        # dataflow blocks (an importer gives none to a function with an If) for FuseOps, and RDP
        # again: FoldBatchnormToConv2D and ConvertToDataflow lose the shapes of If results,
        # CanonicalizeBindings drops casts that only assert dims (docs/sod2.md)
        + ([relax.transform.ConvertToDataflow()] if across else [])
        + ([ApplyRDP()] if dynamic else [])
        + cpu_generic.library_dispatch_passes(host)
        + [relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(), ConcatApart,
           ScaleApart]
        + ([AnnotateSymbolicReshapes] if across else [])
        + [relax.transform.FoldConstant(), relax.transform.FuseOps(), relax.transform.FuseTIR(), UniqueBufferNames,
           InlineMasks, InlineProducts, KeepWide]
    )(mod)
