"""The tiling search's rough estimate (``tiling._estimate``), which picks the plans a stitched
kernel's layer is timed with: it must rank plans as their timing does where the cores of a
cluster share the boxes they load (one multicast through the GB's port)."""

from conftest import conv_relu_model

from tvm_dsa import hardware
from tvm_dsa.harness import import_onnx
from tvm_dsa.tiling import _estimate, timed_cycles
from tvm_dsa.tir_passes import lower_with_plan
from tvm_dsa.tir_passes.tile import TilePlan, anchor_info
from tvm_dsa.tuning import extract_tasks

HW = hardware.get("stcp920")


def test_tiles_sharing_their_weights_are_ranked_before_tiles_of_half_the_columns():
    """A 3 x 3 convolution 128 -> 32 over 14 x 14 pixels (DenseNet-121's block 3 at batch 1):
    tiles of all 32 output channels over 7 pixels, whose cores load one weight box a chunk
    (multicast), against tiles of 16 channels over 14 pixels, which use half the PE array's
    columns. Charged a box a core, the estimate ranked the half-width tiles first."""
    (task,) = extract_tasks(import_onnx(conv_relu_model(128, 32, 14)), "dsa/stcp920")
    func = task.mod["main"]
    info = anchor_info(func)
    assert info.reduction == (128, 3, 3) and info.roles[1] == "N"
    full, half = TilePlan((1, 32, 1, 7), 32), TilePlan((1, 16, 2, 7), 32)
    # input and weights in the GB, as a stitched kernel's layer reads them
    timed = {p: timed_cycles(lower_with_plan(func, p), HW, None, frozenset({0, 1})) for p in (full, half)}
    assert timed[full] < 0.6 * timed[half]
    assert _estimate(info, full, HW, HW.lb_bytes) < _estimate(info, half, HW, HW.lb_bytes)
