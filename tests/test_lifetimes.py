"""GraphTurbo's tensor lifetimes plot: the bars are the stitched kernels' own allocation (captured
while compiling, checked against what the offload reports), spills marked."""

import dataclasses

import pytest
from helpers import HW, KB, residual_block, sub_module, through

from tvm_dsa import hardware
from tvm_dsa.kernel.ir import align
from tvm_dsa.kernelgen.stitch import read_allocation
from tvm_dsa.harness import Compiled, import_onnx, load_model
from tvm_dsa.show.lifetimes import capture_allocations, lifetime_bars, plot_lifetimes


def test_a_graphturbo_compile_captures_every_stitched_kernels_allocation(tmp_path):
    mod = import_onnx(load_model("resnet18", tiny=True, batch=4))
    with capture_allocations() as kernels:
        compiled = Compiled.build(mod, "dsa/stcp920", "graphturbo")
    assert set(kernels) == set(compiled.offload.stitched) and kernels
    for name, buffers in kernels.items():
        info = compiled.offload.stitched[name]
        bars = plot_lifetimes(buffers, tmp_path / f"{name}.png")
        assert (tmp_path / f"{name}.png").stat().st_size > 0
        mine = [b for b in buffers if b.cluster == 0]
        assert len(bars) == len(mine)
        gb = [b for b in bars if b.panel == "GB (cluster 0)"]
        # the GB panel's extent is the allocation's peak the offload reports
        assert max((b.offset + align(b.nbytes) for b in gb), default=0) == info.gb_peak
        assert {(b.first, b.last, b.nbytes) for b in bars} == {(b.first, b.last, b.nbytes) for b in mine}
        assert not any(b.spilled for b in bars) and not info.spilled


def test_spilled_buffers_are_marked(tmp_path):
    """A 1 KiB GB keeps none of the residual block's 2 KiB intermediates: each is spilled to DDR,
    like the 3x3 conv's 4.5 KiB weights, which are read in place (offset -1, drawn under the axis)."""
    hw = hardware.register(dataclasses.replace(HW, name="stcp920-gb1k", gb_bytes=1 * KB), override=True)
    buffers = read_allocation(through(sub_module(residual_block, split=(0, 4)), hw=hw))
    bars = plot_lifetimes(buffers, tmp_path / "spill.svg", title="1 KiB GB")
    spilled = {(b.label, b.nbytes) for b in bars if b.spilled}
    expected = {(f"{b.tensor} @ instance {b.owner}" if b.kind == "t" else f"w: {b.tensor}", b.nbytes)
                for b in buffers if b.cluster == 0 and b.level == "ddr"}
    assert spilled == expected and any(b.kind == "t" for b in bars if b.spilled)
    assert all(b.panel == "DDR (spilled)" for b in bars if b.spilled)
    assert [b.offset for b in bars if b.spilled and b.kind == "w"] == [-1]
    assert "1 KiB GB" in (tmp_path / "spill.svg").read_text()


def test_bad_requests_are_named(tmp_path):
    buffers = read_allocation(through(sub_module(residual_block, split=(0, 4))))
    with pytest.raises(ValueError, match="cluster 7 of this kernel has no buffers"):
        plot_lifetimes(buffers, tmp_path / "x.png", cluster=7)
    with pytest.raises(ValueError, match="use a .png or .svg file"):
        plot_lifetimes(buffers, tmp_path / "x.pdf")
    assert lifetime_bars(buffers, 7) == []


def test_trace_command_draws_each_stitched_kernel(tmp_path, capsys):
    import json

    from tvm_dsa.cli import main

    # tiny MobileNetV2 at batch 8: two stitched kernels (tiny ResNet-18 is one up to batch 16)
    argv = ["trace", "mobilenet_v2", "--tiny", "--batch", "8", "--schedule", "graphturbo", "-o", str(tmp_path / "t.json"),
            "--lifetimes", str(tmp_path / "lt.png"), "--json"]
    assert main(argv) == 0
    files = json.loads(capsys.readouterr().out)["lifetimes"]
    with capture_allocations() as kernels:
        Compiled.build(import_onnx(load_model("mobilenet_v2", tiny=True, batch=8)), "dsa/stcp920", "graphturbo")
    assert set(files) == set(kernels) and len(files) > 1
    assert all(f == str(tmp_path / f"lt-{k}.png") and (tmp_path / f"lt-{k}.png").is_file() for k, f in files.items())
    layerwise = argv[:5] + ["--schedule", "layerwise", "--lifetimes", str(tmp_path / "x.png")]
    assert main(layerwise) == 2  # nothing stitched
    assert "not with --schedule layerwise" in capsys.readouterr().err
