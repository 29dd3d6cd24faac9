"""The tiling search's rough estimate (``tiling._estimate``), which picks the plans a stitched
kernel's layer is timed with: where a cluster's cores share the boxes they load (one multicast
through the GB's port), the plans it ranks first counting each shared box once are timed too."""

from conftest import conv_relu_model

from tvm_dsa import hardware
from tvm_dsa.harness import import_onnx
from tvm_dsa.tiling import _estimate, lower_kernel, lower_timed, timed_cycles
from tvm_dsa.tir_passes import lower_with_plan, plan_of
from tvm_dsa.tir_passes.tile import TilePlan, anchor_info
from tvm_dsa.tuning import extract_tasks

HW = hardware.get("stcp920")


def _conv():
    """A 3 x 3 convolution 128 -> 32 over 14 x 14 pixels (DenseNet-121's block 3 at batch 1)."""
    (task,) = extract_tasks(import_onnx(conv_relu_model(128, 32, 14)), "dsa/stcp920")
    func = task.mod["main"]
    info = anchor_info(func)
    assert info.reduction == (128, 3, 3) and info.roles[1] == "N"
    return func, info


def test_tiles_sharing_their_weights_are_ranked_first_when_a_shared_box_is_counted_once():
    """Tiles of all 32 output channels over 7 pixels, whose cores load one weight box a chunk
    (multicast), against tiles of 16 channels over 14 pixels, which use half the PE array's
    columns: timed, the first are faster; charged a box a core the estimate ranks them last,
    counting a shared box once, first."""
    func, info = _conv()
    full, half = TilePlan((1, 32, 1, 7), 32), TilePlan((1, 16, 2, 7), 32)
    # input and weights in the GB, as a stitched kernel's layer reads them
    timed = {p: timed_cycles(lower_with_plan(func, p), HW, None, frozenset({0, 1})) for p in (full, half)}
    assert timed[full] < 0.6 * timed[half]
    assert _estimate(info, full, HW, HW.lb_bytes) > _estimate(info, half, HW, HW.lb_bytes)
    assert _estimate(info, full, HW, HW.lb_bytes, shared=True) < _estimate(info, half, HW, HW.lb_bytes, shared=True)


def test_a_layer_spread_over_the_clusters_takes_tiles_of_all_the_columns():
    """With its tiles dealt over the four clusters (a single sample's rows split), the layer's
    timed plans include those the shared-box estimate ranks first, and the one kept fills the PE
    array's 32 columns, timed no slower than the fastest the per-core ranking alone offers."""
    func, _ = _conv()
    gb = frozenset({0, 1})
    baseline = lower_kernel(func, HW)[0]
    chosen = lower_timed(func, HW, None, gb, baseline, spread=HW.clusters)
    assert plan_of(chosen).tiles[1] == 32
    half = lower_with_plan(func, TilePlan((1, 16, 2, 7), 32))
    assert timed_cycles(chosen, HW, None, gb, HW.clusters) < timed_cycles(half, HW, None, gb, HW.clusters)
