"""What a lowered SET program keeps on chip (kernelgen.tree): feature maps consumed at once
in the consumers' LBs, weights pinned once per root sub-batch round (seed 002 §3.3.1), DRAM only
across root T-cut children; and the emitter's split of DMA boxes over a tensor kept in pieces."""

import dataclasses

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_dsa
from tvm_dsa import hardware, isa
from tvm_dsa.emit.emitter import PROMOTE
from tvm_dsa.emit.placement import Pieces, Region
from tvm_dsa.kernel.ir import Access
from tvm_dsa.kernelgen.tree import _Kept
from tvm_dsa.schedule.set.scheduler import SetOptions

BATCH = 4  # conftest's resnet18_batch4


@pytest.fixture(scope="module")
def resnet(resnet18_batch4):
    mod, x, ref, graph = resnet18_batch4
    return mod, x, ref, [lay.name for lay in graph.layers], graph


def lowered(resnet, text, chip="set-edge16-fp16"):
    """The tree compiled on ``chip``: (output, TreeProgram)."""
    mod, x, *_ = resnet
    ex = tvm.compile(mod, target=f"dsa/{chip}",
                     relax_pipeline=tvm_dsa.pipeline(schedule="set", options=SetOptions(tree=text)))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    return out, tvm_dsa.pipeline_result().trees["set0"][1]


def ddr_traffic(tp) -> tuple[dict, int, int]:
    """(DDR bytes DMAs read from each argument, bytes read from and written to the DDR scratch
    after the arguments, where intermediates spill). A multicast transfer reads its source once
    (``isa.multicast_groups``: its first DMA)."""
    program = tp.program
    args = {a.name: a for a in program.args}
    end = max(a.offset + a.nbytes for a in program.args)
    reads, scratch_read, scratch_written = dict.fromkeys(args, 0), 0, 0
    instructions = program.kernels[0].instructions
    groups = isa.multicast_groups(instructions)
    for i, ins in enumerate(instructions):
        if not isinstance(ins, isa.Dma) or groups.get(i, (i,))[0] != i:
            continue
        nbytes = int(np.prod(ins.shape)) * ins.dst.itemsize
        for o, write in ((ins.src, False), (ins.dst, True)):
            if o.mem != "ddr":
                continue
            if o.offset >= end:
                scratch_written += nbytes if write else 0
                scratch_read += 0 if write else nbytes
            elif not write:
                name = next(a.name for a in program.args if a.offset <= o.offset < a.offset + a.nbytes)
                reads[name] += nbytes
    return reads, scratch_read, scratch_written


def weight_bytes(tp) -> tuple[int, int]:
    """(bytes of the weight arguments, bytes DMAs read of them from DDR)."""
    reads, _, _ = ddr_traffic(tp)
    weights = [a for a in tp.program.args if a.role == "input" and a.name != "input"]
    return sum(a.nbytes for a in weights), sum(reads[a.name] for a in weights)


def spilled_bytes(graph, producers) -> int:
    """fp16 bytes of the feature maps of ``producers`` at the batch."""
    return sum(graph.layers[u].ofmap for u in producers) * BATCH * 2


def pinned_bytes(tp) -> int:
    """DDR bytes read by the copies that pin weights in the LBs (marked ``promote``; a multicast
    transfer reads once)."""
    kernel = tp.program.kernels[0]
    groups = isa.multicast_groups(kernel.instructions)
    return sum(int(np.prod(ins.shape)) * ins.src.itemsize
               for i, (ins, mark) in enumerate(zip(kernel.instructions, kernel.layer_of_each()))
               if isinstance(ins, isa.Dma) and ins.src.mem == "ddr" and mark is not None and mark.name == PROMOTE
               and groups.get(i, (i,))[0] == i)


@pytest.fixture(scope="module")
def one_segment(resnet):
    _, _, _, names, _ = resnet
    return lowered(resnet, f"T{BATCH}/1( T{BATCH}/1( {' '.join(names)} ) )")


def test_one_segment_keeps_feature_maps_and_weights_on_chip(resnet, one_segment):
    """Under one root child every edge is consumed at once: only the feature map the classifier
    reads through a reshape (a view of DDR bytes) goes through DDR, every weight byte is read from
    DDR exactly once, and the numbers are llvm's."""
    _, _, ref, names, graph = resnet
    out, tp = one_segment
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-2
    flattened = graph.preds[len(names) - 1]  # the classifier's input, flattened
    _, scratch_read, scratch_written = ddr_traffic(tp)
    assert scratch_written == scratch_read == spilled_bytes(graph, flattened)
    total, read = weight_bytes(tp)
    assert read == total
    producers = {u for u, _ in graph.edges}
    assert tp.residency["chunks on chip"] == len(producers) - len(flattened)
    assert tp.residency["chunks through DDR"] == tp.residency["pins refused"] == 0 < tp.residency["pins"]


def test_root_sub_batches_reload_pinned_weights_once_per_round(resnet, one_segment):
    """§3.3.1: under a root T-cut of ``sb`` sub-batches each child's weights are loaded once per
    sub-batch and pinned while it runs: two rounds pin twice what one round pins (a weight left
    unpinned is read by its tiles, at most once per round)."""
    _, _, ref, names, _ = resnet
    out, tp = lowered(resnet, f"T{BATCH}/2( T{BATCH // 2}/1( {' '.join(names)} ) )")
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-2
    assert pinned_bytes(tp) == 2 * pinned_bytes(one_segment[1]) > 0
    assert tp.residency["pins"] == 2 * one_segment[1].residency["pins"]
    total, read = weight_bytes(tp)
    assert total < read <= 2 * total


def test_feature_maps_cross_root_t_cut_children_through_dram(resnet):
    """Two root children: the feature maps from the first to the second are written to DDR once
    and read back; the rest stay on chip (but the classifier's flattened input)."""
    _, _, ref, names, graph = resnet
    half = len(names) // 2
    out, tp = lowered(resnet, f"T{BATCH}/1( T{BATCH}/1( {' '.join(names[:half])} ) "
                              f"T{BATCH}/1( {' '.join(names[half:])} ) )")
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-2
    crossing = {u for u, v in graph.edges if u < half <= v}
    flattened = set(graph.preds[len(names) - 1])
    _, scratch_read, scratch_written = ddr_traffic(tp)
    assert scratch_written == spilled_bytes(graph, crossing | flattened)
    assert scratch_read >= scratch_written  # read back (a halo is read by two tiles)
    assert tp.residency["chunks on chip"] == len({u for u, _ in graph.edges} - crossing - flattened)


def test_pieces_split_a_dma_box_along_their_cuts():
    """A box over a tensor kept in a 2 x 3 grid of pieces splits into sub-boxes each inside one
    piece, together covering the box once; an access walking a cut dim backwards is refused."""
    shape = (4, 12)
    cells = {}
    for i, (r0, r1) in enumerate(((0, 2), (2, 4))):
        for j, (c0, c1) in enumerate(((0, 5), (5, 8), (8, 12))):
            cells[(i, j)] = Region("lb", 3 * i + j, 0, (r0, c0), (r1 - r0, c1 - c0), "float16")
    pieces = Pieces(shape, ((2,), (5, 8)), cells)
    # box rows 1..3, columns 3..10: loop 0 walks the columns, loop 1 the rows
    acc = Access("t", False, (1, 3), ((), ()), ((0, 1), (1, 0)))
    parts = pieces.split(acc, [], [0, 0], [8, 3])
    covered = np.zeros(shape, int)
    for start, extent, region in parts:
        rows = slice(1 + start[1], 1 + start[1] + extent[1])
        cols = slice(3 + start[0], 3 + start[0] + extent[0])
        covered[rows, cols] += 1
        (r0, c0), (nr, nc) = region.origin, region.extents
        assert r0 <= rows.start and rows.stop <= r0 + nr and c0 <= cols.start and cols.stop <= c0 + nc
    expected = np.zeros(shape, int)
    expected[1:4, 3:11] = 1
    assert (covered == expected).all() and len(parts) == 6
    with pytest.raises(Exception, match="not by loops with positive coefficients"):
        pieces.split(Access("t", False, (3, 0), ((), ()), ((-1, 0), (0, 1))), [], [0, 0], [2, 2])


def test_pieces_split_strided_and_window_boxes_where_their_indices_cross_a_cut():
    """Over a tensor cut into column pieces [0, 5), [5, 8), [8, 12), sub-boxes each inside one
    piece read every element the access reads, as often: a stride-2 access (a stride-2 1 x 1
    convolution's pixels, columns 1, 3 | 5, 7 | 9, 11) splits between its indices; by 3 (4 | 7 |
    10) it gains no empty box; a window's columns 2 * o + k (o < 4, k < 3) split into a slice
    per k (the shorter loop), each cut where it crosses a piece: 0, 2, 4 | 6; 1, 3 | 5, 7; 2, 4 |
    6 | 8."""
    cells = {(0, j): Region("lb", j, 0, (0, c0), (2, c1 - c0), "float16")
             for j, (c0, c1) in enumerate(((0, 5), (5, 8), (8, 12)))}
    pieces = Pieces((2, 12), ((), (5, 8)), cells)
    cases = [  # (first column, coefficients of the loops along columns, then rows; box extent; sub-boxes)
        (1, ((2, 0), (0, 1)), [6, 2], 3),
        (4, ((3, 0), (0, 1)), [3, 2], 3),
        (0, ((2, 0, 1), (0, 1, 0)), [4, 2, 3], 7),
    ]
    for first, (cols, rows), extent, count in cases:
        acc = Access("t", False, (0, first), ((), ()), (rows, cols))

        def elements(start, ext):
            return sorted((sum(r * (s + k) for r, s, k in zip(rows, start, at)),
                           first + sum(c * (s + k) for c, s, k in zip(cols, start, at))) for at in np.ndindex(*ext))

        parts = pieces.split(acc, [], [0] * len(extent), extent)
        read = []
        for start, ext, region in parts:
            got = elements(start, ext)
            (_, c0), (_, nc) = region.origin, region.extents
            assert got and all(c0 <= c < c0 + nc for _, c in got)
            read += got
        assert sorted(read) == elements([0] * len(extent), extent) and len(parts) == count



def test_pins_load_ahead_on_the_prefetch_queues_in_long_rows(one_segment):
    """set-edge16-fp16 gives each tile a prefetch queue: the weights a layer pins load on it
    while earlier layers run, all but the first layer's (loaded before anything computes), and
    in pieces whose DDR rows span at least four 64-byte bursts where the piece is that large (cut
    along the output channels, not the input channels of a 1 x 1 convolution)."""
    from tvm_dsa.runtime.cost import contiguous_run
    kernel = one_segment[1].program.kernels[0]
    first_mme = next(n for n, ins in enumerate(kernel.instructions) if isinstance(ins, isa.Mme))
    pins = [(n, ins) for n, (ins, mark) in enumerate(zip(kernel.instructions, kernel.layer_of_each()))
            if isinstance(ins, isa.Dma) and ins.src.mem == "ddr" and mark is not None and mark.name == PROMOTE]
    ahead = [n for n, ins in pins if ins.prefetch]
    assert ahead and all(n < first_mme for n, ins in pins if not ins.prefetch)
    assert any(n > first_mme for n in ahead)
    for _, ins in pins:
        nbytes = int(np.prod(ins.shape)) * ins.src.itemsize
        assert contiguous_run(ins.src, ins.shape) * ins.src.itemsize >= min(4 * 64, nbytes)


def test_pinned_weights_are_cut_where_their_ddr_rows_stay_long():
    """A 1 x 1 convolution's (2048, 512, 1, 1) int8 weights read by tiles of 256 output channels
    and input chunks of 32: 16 pieces along the input channels give every box one piece, but
    32-byte DDR rows (each a 64-byte burst); with rows of at least 256 bytes required the cut
    goes along the output channels (2 pieces per box, rows of whole 512-byte filters)."""
    from types import SimpleNamespace
    from tvm_dsa.kernelgen.tree import _grid
    reader = SimpleNamespace(ir=SimpleNamespace(stages=lambda: []))  # splittable along every dim
    lo = np.array([(n, k, 0, 0) for n in range(0, 2048, 256) for k in range(0, 512, 32)])
    boxes = (lo, lo + np.array([256, 32, 1, 1]))
    assert _grid((2048, 512, 1, 1), [(reader, "w", boxes)], 16, 0)[0] == 1
    assert _grid((2048, 512, 1, 1), [(reader, "w", boxes)], 16, 0, run=256)[0] == 0


def _holder_copies(tp) -> list[str]:
    """Layers of the LB-to-LB copies of one tile buffer into another core's same buffer (the same
    offset and strides: ``KernelEmitter._holder``'s copy tree)."""
    kernel = tp.program.kernels[0]
    return [mark.name for ins, mark in zip(kernel.instructions, kernel.layer_of_each())
            if isinstance(ins, isa.Dma) and ins.src.mem == ins.dst.mem == "lb" and ins.src.index != ins.dst.index
            and (ins.src.offset, ins.src.strides) == (ins.dst.offset, ins.dst.strides)]


def test_boxes_kept_in_lbs_are_loaded_from_their_pieces_not_copied_along_a_tree(resnet, one_segment):
    """Under one root child every feature map and weight a layer reads is kept in LBs: each tile
    loads its box from the pieces, spread over their cores; only the first layer, which reads the
    network's input from DDR, may copy a box from the tile that loaded it (a DDR read once)."""
    _, _, _, names, _ = resnet
    assert set(_holder_copies(one_segment[1])) <= {names[0]}


def test_tiles_loading_one_box_receive_it_in_one_multicast():
    """Two 3 x 3 convolutions (64 -> 128 -> 256 channels) on set-edge16-fp16 (``multicast_dma``):
    the tiles splitting a layer's output channels over the cores need the same input rows, from
    DDR (the first layer) or from the pieces the first layer left in other cores' LBs (the
    second). Their loads are multicast DMAs, grouped into transfers of distinct cores loading one
    box to one place, each reading its source once: the program's DDR and LB reads (payload) are
    the same program's with the flags cleared minus what the other members would have read. The
    transfers from LBs are named (``Dma.group``: the loads of one round of tiles,
    ``KernelEmitter._group_multicasts``); inferred across rounds they made the program 1.4x
    slower. It runs faster than the program without multicasts. Values: llvm's."""
    import dataclasses

    from onnx import TensorProto, helper, numpy_helper

    from tvm_dsa.harness import import_onnx
    from tvm_dsa.isa.instructions import multicast_groups
    from tvm_dsa.runtime import simulate

    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((128, 64, 3, 3)).astype(np.float32) * 0.05, "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((256, 128, 3, 3)).astype(np.float32) * 0.05, "w2")
    graph = helper.make_graph([helper.make_node("Conv", ["x", "w1"], ["h"], pads=[1, 1, 1, 1]),
                               helper.make_node("Relu", ["h"], ["r"]),
                               helper.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1, 1, 1])], "convs",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 28, 28])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 256, 28, 28])], [w1, w2])
    mod = import_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10))
    x = rng.standard_normal((1, 64, 28, 28)).astype(np.float32)
    ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ex = tvm.compile(mod, target="dsa/set-edge16-fp16", relax_pipeline=tvm_dsa.pipeline(schedule="set"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    assert np.abs(out - ref).max() / np.abs(ref).max() < 2e-3

    program = tvm_dsa.pipeline_result().trees["set0"][1].program.expanded()
    instrs = program.kernels[0].instructions
    groups = {tuple(g) for g in multicast_groups(instrs).values() if len(g) > 1}
    assert {instrs[g[0]].src.mem for g in groups} == {"ddr", "lb"}
    assert all(bool(instrs[g[0]].group) == (instrs[g[0]].src.mem == "lb") for g in groups)
    for g in groups:
        first = instrs[g[0]]
        assert first.dst.mem == "lb" and len({instrs[i].core for i in g}) == len(g)
        assert all((instrs[i].src, instrs[i].shape, instrs[i].dst.offset) == (first.src, first.shape, first.dst.offset)
                   for i in g)
    riders = sum(int(np.prod(instrs[i].shape)) * instrs[i].src.itemsize for g in groups for i in g[1:])
    plain = dataclasses.replace(program, kernels=(dataclasses.replace(
        program.kernels[0], instructions=tuple(dataclasses.replace(i, multicast=False, group=0) if isinstance(i, isa.Dma) else i
                                               for i in instrs)),))
    together = simulate(program, mode="timing").report
    alone = simulate(plain, mode="timing").report
    assert together.ddr_read + together.lb_read == alone.ddr_read + alone.lb_read - riders
    assert together.cycles < alone.cycles



def test_weights_a_layer_does_not_pin_load_ahead_of_each_invocation(resnet):
    """Under an inner T-cut of four sub-batches one layer is left unpinned (its weights would
    not fit beside the others': set-edge16-fp16 with a 384 KiB LB, whose retained half holds
    98,304 elements, leaves the last 3 x 3 convolution's 147,584 on one tile): it reads its
    weights once per invocation. On set-edge16-fp16, whose DDR is slower than a mesh link
    (``kernelgen.tree._ahead``), they load into pieces on the prefetch queues while the
    invocations before it run, and its tiles read the pieces: its weights are read from DDR only
    by those loads, at most once per invocation (a tile buffer still holding the box from the
    invocation before reads nothing); the numbers are llvm's."""
    _, _, ref, names, _ = resnet
    chip = hardware.register(dataclasses.replace(hardware.get("set-edge16-fp16"), name="set-edge16-fp16-lb384k",
                                                 lb_bytes=384 * 1024), override=True)
    out, tp = lowered(resnet, f"T{BATCH}/1( T{BATCH}/4( {' '.join(names)} ) )", chip.name)
    assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-2
    unpinned = [p for p in tp.schedule.leaves if not p.pinned]
    assert len(unpinned) == 1 and tp.residency["weights ahead"] > 0
    reads, _, _ = ddr_traffic(tp)
    weights = [a for a in tp.program.args if a.role == "input" and a.name != "input"]
    again = [a for a in weights if reads[a.name] > a.nbytes]  # the unpinned layer's
    assert again and all(reads[a.name] <= unpinned[0].invocations * a.nbytes for a in again)
    assert all(reads[a.name] == a.nbytes for a in weights if a not in again)
    kernel = tp.program.kernels[0]
    for ins, mark in zip(kernel.instructions, kernel.layer_of_each()):
        if isinstance(ins, isa.Dma) and ins.src.mem == "ddr" and \
                any(a.offset <= ins.src.offset < a.offset + a.nbytes for a in again):
            assert ins.prefetch and mark.name == PROMOTE


def test_a_layer_loads_its_weights_ahead_where_a_link_gathers_a_tiles_share_faster_than_ddr_reads_all():
    """``_ahead``: a core gathering its tiles' weights over one mesh link must take less than DDR
    takes for the layer's weights. set-edge16's DDR (16.4 B/cycle) is slower than a link (32):
    always. On set-cloud144 (147.5 B/cycle) a tile's share must be under 32 / 147.5 of the
    weights; a chip without prefetch queues never loads ahead."""
    from types import SimpleNamespace

    from tvm_dsa import hardware
    from tvm_dsa.kernelgen.tree import _ahead
    ir = SimpleNamespace(params=[("x", None, None), ("w", None, None), ("y", None, None)])
    L = SimpleNamespace(ir=ir, args={"x": "x", "w": "w", "y": "y"})
    k = SimpleNamespace(tensors={"w": ((1000, 10), "float32")}, weights=frozenset({"w"}))
    edge, cloud = hardware.get("set-edge16"), hardware.get("set-cloud144")
    assert _ahead(10_000, L, k, edge)
    share = 10_000 * cloud.noc_link_bytes_per_cycle / cloud.ddr_bytes_per_cycle  # 2,170 elements
    assert _ahead(int(share) - 1, L, k, cloud) and not _ahead(int(share) + 1, L, k, cloud)
    assert not _ahead(1, L, k, hardware.get("stcp920"))


def test_weights_are_cut_at_the_tiles_boxes_and_copied_to_one_place_on_each_reading_core(one_segment):
    """On a mesh with multicast DMAs a pinned weight is cut where its tiles' boxes start and end
    (the output channels they split), and each core reading a piece gets a copy at the same LB
    offset: one multicast from DDR, read once, fills them all."""
    from types import SimpleNamespace
    from tvm_dsa.kernelgen.tree import _Arena, _tile_cuts
    reader = SimpleNamespace(ir=SimpleNamespace(stages=lambda: []))  # splittable along every dim
    lo = np.array([(n, 0, 0, 0) for n in range(0, 256, 64) for _ in range(3)])  # 3 tiles per 64 channels
    assert _tile_cuts((256, 128, 3, 3), reader, "w", (lo, lo + np.array([64, 128, 3, 3]))) == (0, (64, 128, 192))
    assert _tile_cuts((64, 8), reader, "w", (np.zeros((2, 2), int), np.array([[64, 8]] * 2))) == (None, ())
    # tiles of 256 output x 32 input channels of a 1 x 1 convolution: cut along the inputs (16
    # places against 7) unless that leaves DDR rows of 32 bytes, under the 256 required
    lo = np.array([(n, k, 0, 0) for n in range(0, 2048, 256) for k in range(0, 512, 32)])
    boxes = (lo, lo + np.array([256, 32, 1, 1]))
    assert _tile_cuts((2048, 512, 1, 1), reader, "w", boxes)[0] == 1
    assert _tile_cuts((2048, 512, 1, 1), reader, "w", boxes, run=256) == (0, tuple(range(256, 2048, 256)))

    arena = _Arena(0, 1024)
    assert arena.take(0, 256) == 0 and arena.take(1, 512) == 0  # core 0 free from 256, core 1 from 512
    assert arena.take_common([0, 1], 256, keep=512) is None  # core 1 would keep 256 free
    assert arena.take_common([0, 1], 256) == 512
    assert arena.free[0] == [(256, 512), (768, 1024)] and arena.free[1] == [(768, 1024)]

    kernel = one_segment[1].program.kernels[0]
    groups = isa.multicast_groups(kernel.instructions)
    copies = [g for i, g in groups.items() if g[0] == i and kernel.layer_of_each()[i] is not None
              and kernel.layer_of_each()[i].name == PROMOTE]
    assert any(len(g) > 1 for g in copies)  # a piece several cores read, loaded once for all
    for g in copies:
        members = [kernel.instructions[i] for i in g]
        assert len({m.dst.index for m in members}) == len(members) and len({m.dst.offset for m in members}) == 1


def test_pieces_go_where_their_readers_elements_travel_fewest_hops_and_spread():
    """On a 4 x 4 mesh (cores numbered row by row) a piece read by cores 12 and 15 alike goes to
    a core of the bottom row between them (each costs 3 hops per element pair), the first such
    holder; with a piece of the chunk already there, the next core between them (one hop more
    per element on the first); a piece its readers' cores alone read goes to the core reading
    most; a piece no tile reads to the j-th holder."""
    width = 4
    kept = _Kept("t", None, None, 2, tuple(range(16)), 1,
                 readers={(0,): {12: 100, 15: 100}, (1,): {5: 300, 6: 100}, (2,): {}})

    def hops(a, b):
        return abs(a % width - b % width) + abs(a // width - b // width)

    between = [c for c in range(16) if hops(c, 12) + hops(c, 15) == hops(12, 15)]
    assert between == [12, 13, 14, 15]
    assert kept.homes((0,), 0, {}, width)[0] == 12
    assert kept.homes((0,), 1, {12: 1}, width)[0] == 13
    assert kept.homes((1,), 0, {}, width)[0] == 5
    assert kept.homes((2,), 3, {}, width) == [3]


def test_layers_off_the_mme_take_their_neighbours_tiles(monkeypatch):
    """Tiny GoogLeNet under one segment on set-cloud144-fp16: alone (``_neighbour_tiles`` off)
    its concatenation and pooling layers split channels, as the whole-chip tiling does; with their
    neighbours in view some split them less (the 1 x 1 convolutions reading them read every
    channel), fewer DMAs cross between cores, and the numbers stay llvm's."""
    from tvm_dsa.emit.footprint import footprints
    from tvm_dsa.harness import import_onnx, layer_graph
    from tvm_dsa.kernelgen import tree
    from tvm_dsa.models import TINY, example_inputs, get_model

    model = get_model("googlenet", batch=1, **TINY["googlenet"])
    mod, x = import_onnx(model), example_inputs(model)["input"]
    ref = relax.VirtualMachine(tvm.compile(mod, target="llvm"), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    names = [lay.name for lay in layer_graph(get_model("googlenet", **TINY["googlenet"])).layers]
    chosen = {}
    retile = tree._neighbour_tiles

    def recorded(spec, layers, budgets, ctx):
        before = list(layers)
        retile(spec, layers, budgets, ctx)
        chosen.update({a.name: (a, b) for a, b in zip(before, layers) if a is not b})

    remote = {}
    for viewed, retiling in (("alone", lambda *a: None), ("neighbours", recorded)):
        monkeypatch.setattr(tree, "_neighbour_tiles", retiling)
        out, tp = lowered((mod, x), f"T1/1( T1/1( {' '.join(names)} ) )", "set-cloud144-fp16")
        assert float(np.abs(out - ref).max() / np.abs(ref).max()) < 2e-2
        remote[viewed] = sum(isinstance(i, isa.Dma) and i.src.mem == i.dst.mem == "lb" and i.src.index != i.dst.index
                             for i in tp.program.kernels[0].instructions)
    assert chosen and remote["neighbours"] < remote["alone"]

    def splits(layer, d):  # the tiles' distinct starts along dim d of the output
        return len(set(footprints(layer).write[0][:, d].tolist()))

    for old, new in chosen.values():  # the convolutions reading them read every channel
        assert splits(new, 1) < splits(old, 1)
