"""Branchy CNNs for inter-layer scheduling (seed 002 §5's workloads): GoogLeNet, Inception-ResNet-v1
and PNASNet-5.

Inputs are ``input`` float32 [batch, 3, image, image], the output ``logits`` [batch, num_classes];
every convolution is Conv + BatchNorm (+ ReLU) like torchvision's ``BasicConv2d``. ``width``
scales channel counts and the block counts are arguments, so the zoo's tiny sizes keep the
topology at a fraction of the cost.
"""

from __future__ import annotations

from typing import Sequence

import onnx

from tvm_dsa.models.builder import GraphBuilder

# -------------------------------------------------------------------------------- GoogLeNet
# Inception modules (Szegedy et al. 2015, Table 1): input channels are the previous module's
# output; (#1x1, #3x3 reduce, #3x3, #5x5 reduce, #5x5, pool proj), by stage (28², 14², 7²).
GOOGLENET_MODULES = (
    ((64, 96, 128, 16, 32, 32), (128, 128, 192, 32, 96, 64)),
    ((192, 96, 208, 16, 48, 64), (160, 112, 224, 24, 64, 64), (128, 128, 256, 24, 64, 64),
     (112, 144, 288, 32, 64, 64), (256, 160, 320, 32, 128, 128)),
    ((256, 160, 320, 32, 128, 128), (384, 192, 384, 48, 128, 128)),
)


def _ch(c: int, width: float) -> int:
    return max(4, round(c * width))


def _inception(b: GraphBuilder, x: str, cin: int, spec: Sequence[int], width: float) -> tuple[str, int]:
    c1, r3, c3, r5, c5, pp = (_ch(c, width) for c in spec)
    y1 = b.conv_bn(x, cin, c1, 1, name="branch1")
    y2 = b.conv_bn(b.conv_bn(x, cin, r3, 1, name="branch2.0"), r3, c3, 3, name="branch2.1")
    y3 = b.conv_bn(b.conv_bn(x, cin, r5, 1, name="branch3.0"), r5, c5, 5, name="branch3.1")
    y4 = b.conv_bn(b.maxpool(x, 3, 1, 1), cin, pp, 1, name="branch4.1")
    return b.concat([y1, y2, y3, y4], axis=1), c1 + c3 + c5 + pp


def googlenet(batch: int = 1, image: int = 224, num_classes: int = 1000, width: float = 1.0,
              modules: Sequence[int] = (2, 5, 2), seed: int = 0) -> onnx.ModelProto:
    """GoogLeNet (Inception v1, without the auxiliary classifiers). ``modules``: how many of each
    stage's inception modules to keep (the first ones)."""
    modules = tuple(modules)
    if len(modules) != 3 or any(not 1 <= n <= len(s) for n, s in zip(modules, GOOGLENET_MODULES)):
        raise ValueError(f"modules must give 1..{[len(s) for s in GOOGLENET_MODULES]} modules per stage, got {modules}")
    cfg = dict(batch=batch, image=image, num_classes=num_classes, width=width, modules=list(modules), seed=seed)
    b = GraphBuilder("googlenet", seed)
    x = b.input("input", [batch, 3, image, image])
    x = b.maxpool(b.conv_bn(x, 3, _ch(64, width), 7, 2, 3, name="conv1"), 3, 2, 1)
    x = b.conv_bn(x, _ch(64, width), _ch(64, width), 1, name="conv2")
    x = b.maxpool(b.conv_bn(x, _ch(64, width), _ch(192, width), 3, name="conv3"), 3, 2, 1)
    c = _ch(192, width)
    for stage, (n, specs) in enumerate(zip(modules, GOOGLENET_MODULES)):
        if stage:
            x = b.maxpool(x, 3, 2, 1) if stage == 1 else b.maxpool(x, 2, 2)
        for i, spec in enumerate(specs[:n]):
            with b.scope(f"inception{stage + 3}{'abcde'[i]}"):
                x, c = _inception(b, x, c, spec, width)
    x = b.gap_flatten(x)
    b.output(b.gemm(x, c, num_classes, name="fc"), "logits")
    return b.build(cfg)


# ---------------------------------------------------------------------- Inception-ResNet-v1
def _scaled_residual(b: GraphBuilder, x: str, branches: list[str], cat: int, c: int, scale: float) -> str:
    """x + scale * (1x1 linear conv of the concatenated branches), then ReLU (Fig. 10, 11, 13)."""
    y = b.conv(b.concat(branches, axis=1) if len(branches) > 1 else branches[0], cat, c, 1, bias=True,
               gain=1.0, name="up")
    return b.relu(b.add(x, b.scale(y, scale)))


def _factorized_block(b: GraphBuilder, x: str, c: int, ch: int, n: int, scale: float) -> str:
    """Inception-ResNet-B / -C: a 1x1 branch and a 1x1 -> 1xn -> nx1 branch of ``ch`` channels."""
    y1 = b.conv_bn(x, c, ch, 1, name="b1")
    y2 = b.conv_bn(b.conv_bn(b.conv_bn(x, c, ch, 1, name="b2.0"), ch, ch, (1, n), name="b2.1"),
                   ch, ch, (n, 1), name="b2.2")
    return _scaled_residual(b, x, [y1, y2], 2 * ch, c, scale)


def inception_resnet_v1(batch: int = 1, image: int = 299, num_classes: int = 1000, width: float = 1.0,
                        blocks: Sequence[int] = (5, 10, 5), seed: int = 0) -> onnx.ModelProto:
    """Inception-ResNet-v1 (Szegedy et al. 2016, Fig. 14 with Fig. 10-13 and Table 1's k, l, m, n
    = 192, 192, 256, 384): stem, ``blocks`` Inception-ResNet-A / -B / -C blocks with Reduction-A
    and -B between them."""
    blocks = tuple(blocks)
    if len(blocks) != 3 or min(blocks) < 1:
        raise ValueError(f"blocks must give at least one A, B and C block, got {blocks}")
    cfg = dict(batch=batch, image=image, num_classes=num_classes, width=width, blocks=list(blocks), seed=seed)
    b = GraphBuilder("inception_resnet_v1", seed)
    w = lambda c: _ch(c, width)  # noqa: E731
    x = b.input("input", [batch, 3, image, image])
    with b.scope("stem"):  # Fig. 14: valid convolutions unless marked otherwise
        x = b.conv_bn(x, 3, w(32), 3, 2, 0, name="conv1")
        x = b.conv_bn(x, w(32), w(32), 3, 1, 0, name="conv2")
        x = b.maxpool(b.conv_bn(x, w(32), w(64), 3, name="conv3"), 3, 2)
        x = b.conv_bn(x, w(64), w(80), 1, name="conv4")
        x = b.conv_bn(x, w(80), w(192), 3, 1, 0, name="conv5")
        x = b.conv_bn(x, w(192), w(256), 3, 2, 0, name="conv6")
    c = w(256)
    for i in range(blocks[0]):
        with b.scope(f"block_a{i}"):  # Fig. 10
            y1 = b.conv_bn(x, c, w(32), 1, name="b1")
            y2 = b.conv_bn(b.conv_bn(x, c, w(32), 1, name="b2.0"), w(32), w(32), 3, name="b2.1")
            y3 = b.conv_bn(b.conv_bn(b.conv_bn(x, c, w(32), 1, name="b3.0"), w(32), w(32), 3, name="b3.1"),
                           w(32), w(32), 3, name="b3.2")
            x = _scaled_residual(b, x, [y1, y2, y3], 3 * w(32), c, 0.17)
    with b.scope("reduction_a"):  # Fig. 7 with k, l, m, n = 192, 192, 256, 384
        y1 = b.maxpool(x, 3, 2)
        y2 = b.conv_bn(x, c, w(384), 3, 2, 0, name="b2")
        y3 = b.conv_bn(b.conv_bn(b.conv_bn(x, c, w(192), 1, name="b3.0"), w(192), w(192), 3, name="b3.1"),
                       w(192), w(256), 3, 2, 0, name="b3.2")
        x, c = b.concat([y1, y2, y3], axis=1), c + w(384) + w(256)
    for i in range(blocks[1]):
        with b.scope(f"block_b{i}"):  # Fig. 11
            x = _factorized_block(b, x, c, w(128), 7, 0.10)
    with b.scope("reduction_b"):  # Fig. 12
        y1 = b.maxpool(x, 3, 2)
        y2 = b.conv_bn(b.conv_bn(x, c, w(256), 1, name="b2.0"), w(256), w(384), 3, 2, 0, name="b2.1")
        y3 = b.conv_bn(b.conv_bn(x, c, w(256), 1, name="b3.0"), w(256), w(256), 3, 2, 0, name="b3.1")
        y4 = b.conv_bn(b.conv_bn(b.conv_bn(x, c, w(256), 1, name="b4.0"), w(256), w(256), 3, name="b4.1"),
                       w(256), w(256), 3, 2, 0, name="b4.2")
        x, c = b.concat([y1, y2, y3, y4], axis=1), c + w(384) + 2 * w(256)
    for i in range(blocks[2]):
        with b.scope(f"block_c{i}"):  # Fig. 13
            x = _factorized_block(b, x, c, w(192), 3, 0.20)
    x = b.gap_flatten(x)
    b.output(b.gemm(x, c, num_classes, name="fc"), "logits")
    return b.build(cfg)


# ---------------------------------------------------------------------------------- PNASNet-5
def _sep(b: GraphBuilder, x: str, c: int, k: int, stride: int, name: str) -> str:
    """ReLU -> depthwise k x k -> pointwise 1x1 -> BN (one application; NASNet applies it twice)."""
    with b.scope(name):
        y = b.conv(b.relu(x), c, c, k, stride, k // 2, groups=c, name="dw")
        return b.conv_bn(y, c, c, 1, act=None, name="pw")


def _pnas_cell(b: GraphBuilder, left: str, right: str, c: int, stride: int) -> str:
    """The PNASNet-5 cell (Liu et al. 2018, Fig. 1): five blocks, each the sum of two operations
    on the cell's inputs or an earlier block, concatenated."""
    pool = lambda x: b.maxpool(x, 3, stride, 1)  # noqa: E731
    b0 = b.add(_sep(b, left, c, 5, stride, "b0.sep5"), pool(left))
    b1 = b.add(_sep(b, right, c, 7, stride, "b1.sep7"), pool(right))
    b2 = b.add(_sep(b, right, c, 5, stride, "b2.sep5"), _sep(b, right, c, 3, stride, "b2.sep3"))
    b3 = b.add(_sep(b, b2, c, 3, 1, "b3.sep3"), pool(right))
    ident = right if stride == 1 else b.conv_bn(right, c, c, 1, stride, act=None, name="b4.reduce")
    b4 = b.add(_sep(b, left, c, 3, stride, "b4.sep3"), ident)
    return b.concat([b0, b1, b2, b3, b4], axis=1)


def pnasnet(batch: int = 1, image: int = 224, num_classes: int = 1000, filters: int = 54,
            cells: int = 3, stages: int = 3, seed: int = 0) -> onnx.ModelProto:
    """PNASNet-5 for ImageNet (the Mobile configuration by default: N = 3 cells per stage, F = 54
    filters): a stride-2 stem convolution, two reduction cells (F/4 and F/2 filters), then
    ``stages`` stages of ``cells`` cells with a reduction cell (stride 2, filters doubled) between
    stages. Each cell reads the two previous cells' outputs through 1x1 convolutions (a stride-2
    one when the earlier is larger: NASNet's factorized reduction simplified)."""
    if cells < 1 or stages < 1 or filters < 4:
        raise ValueError(f"cells and stages must be >= 1 and filters >= 4, got {cells}, {stages}, {filters}")
    cfg = dict(batch=batch, image=image, num_classes=num_classes, filters=filters, cells=cells, stages=stages,
               seed=seed)
    b = GraphBuilder("pnasnet", seed)
    x = b.input("input", [batch, 3, image, image])
    stem = max(4, filters // 2)
    x = b.conv_bn(x, 3, stem, 3, 2, name="stem")
    prev, cur, cp, cc = x, x, stem, stem  # h_{c-2}, h_{c-1}, their channels
    size = prev_size = (image + 1) // 2
    c = filters // 4
    reductions = [True, True] + [i == cells for s in range(stages) for i in range(cells + (s < stages - 1))]
    for k, reduction in enumerate(reductions):
        with b.scope(f"cell{k}"):
            left = b.conv_bn(cur, cc, c, 1, name="left")
            right = b.conv_bn(prev, cp, c, 1, 2 if prev_size > size else 1, name="right")
            out = _pnas_cell(b, left, right, c, 2 if reduction else 1)
        prev, prev_size, cp = cur, size, cc
        cur, cc = out, 5 * c
        if reduction:
            size, c = (size + 1) // 2, 2 * c
    x = b.gap_flatten(b.relu(cur))
    b.output(b.gemm(x, cc, num_classes, name="fc"), "logits")
    return b.build(cfg)
