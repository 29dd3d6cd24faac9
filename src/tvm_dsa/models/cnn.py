"""Image-classification CNNs: ResNet-18/50 (v1.5), MobileNetV2, DenseNet-121.

Topologies follow torchvision; inputs are ``input`` float32 [batch, 3, image, image], the
output ``logits`` float32 [batch, num_classes].
"""

from __future__ import annotations

from typing import Sequence

import onnx

from tvm_dsa.models.builder import GraphBuilder

# Gamma of the last BatchNorm of a residual branch: var(x + f(x)) = var(x) (1 + g^2), so a
# small g keeps the residual stream from growing by 2x per block (cf. zero-init-residual).
RESIDUAL_BN_GAMMA = 0.3


def _image_input(b: GraphBuilder, batch: int, image: int) -> str:
    return b.input("input", [batch, 3, image, image])


def _classifier(b: GraphBuilder, x: str, channels: int, num_classes: int) -> str:
    x = b.gap_flatten(x)
    return b.output(b.gemm(x, channels, num_classes, name="fc"), "logits")


# ---------------------------------------------------------------------------- ResNet
def _basic_block(b: GraphBuilder, x: str, cin: int, width: int, stride: int) -> tuple[str, int]:
    cout = width
    y = b.conv_bn(x, cin, width, 3, stride, name="conv1")
    y = b.conv_bn(y, width, cout, 3, 1, act=None, bn_gamma=RESIDUAL_BN_GAMMA, name="conv2")
    return _residual(b, x, y, cin, cout, stride), cout


def _bottleneck(b: GraphBuilder, x: str, cin: int, width: int, stride: int) -> tuple[str, int]:
    cout = width * 4
    y = b.conv_bn(x, cin, width, 1, name="conv1")
    y = b.conv_bn(y, width, width, 3, stride, name="conv2")   # v1.5: stride on the 3x3
    y = b.conv_bn(y, width, cout, 1, act=None, bn_gamma=RESIDUAL_BN_GAMMA, name="conv3")
    return _residual(b, x, y, cin, cout, stride), cout


def _residual(b: GraphBuilder, x: str, y: str, cin: int, cout: int, stride: int) -> str:
    if stride != 1 or cin != cout:
        x = b.conv_bn(x, cin, cout, 1, stride, act=None, name="downsample")
    return b.relu(b.add(y, x))


RESNET_DEPTHS = {18: (_basic_block, (2, 2, 2, 2)), 34: (_basic_block, (3, 4, 6, 3)),
                 50: (_bottleneck, (3, 4, 6, 3)), 101: (_bottleneck, (3, 4, 23, 3))}


def resnet(depth: int = 50, batch: int = 1, image: int = 224, num_classes: int = 1000,
           width: float = 1.0, layers: Sequence[int] | None = None,
           seed: int = 0) -> onnx.ModelProto:
    """ResNet v1.5. ``width`` scales all channel counts, ``layers`` overrides blocks/stage."""
    if depth not in RESNET_DEPTHS:
        raise ValueError(f"unsupported ResNet depth {depth}; choose from {sorted(RESNET_DEPTHS)}")
    block, default_layers = RESNET_DEPTHS[depth]
    layers = tuple(layers or default_layers)
    cfg = dict(depth=depth, batch=batch, image=image, num_classes=num_classes, width=width,
               layers=list(layers), seed=seed)
    b = GraphBuilder(f"resnet{depth}", seed)
    base = max(1, round(64 * width))
    x = _image_input(b, batch, image)
    x = b.conv_bn(x, 3, base, 7, 2, 3, name="conv1")
    x = b.maxpool(x, 3, 2, 1)
    c = base
    for stage, n in enumerate(layers):
        for i in range(n):
            stride = 2 if (i == 0 and stage > 0) else 1
            with b.scope(f"layer{stage + 1}.{i}"):
                x, c = block(b, x, c, base * 2 ** stage, stride)
    _classifier(b, x, c, num_classes)
    return b.build(cfg)


def resnet18(**kw) -> onnx.ModelProto:
    return resnet(18, **kw)


def resnet50(**kw) -> onnx.ModelProto:
    return resnet(50, **kw)


# ------------------------------------------------------------------------ MobileNetV2
# (expansion t, channels c, repeats n, first stride s)
MOBILENET_V2_SETTINGS = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
                         (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))


def _make_divisible(v: float, divisor: int = 8) -> int:
    new_v = max(divisor, int(v + divisor / 2) // divisor * divisor)
    return new_v + divisor if new_v < 0.9 * v else new_v


def mobilenet_v2(batch: int = 1, image: int = 224, num_classes: int = 1000,
                 width: float = 1.0, settings: Sequence[Sequence[int]] | None = None,
                 seed: int = 0) -> onnx.ModelProto:
    """MobileNetV2 (torchvision layout). ``settings`` overrides the (t, c, n, s) table."""
    settings = [tuple(s) for s in (settings or MOBILENET_V2_SETTINGS)]
    cfg = dict(batch=batch, image=image, num_classes=num_classes, width=width,
               settings=[list(s) for s in settings], seed=seed)
    b = GraphBuilder("mobilenet_v2", seed)
    c = _make_divisible(32 * width)
    last = _make_divisible(1280 * max(1.0, width))
    x = _image_input(b, batch, image)
    x = b.conv_bn(x, 3, c, 3, 2, act="relu6", name="features.0")
    idx = 1
    for t, ch, n, s in settings:
        cout = _make_divisible(ch * width)
        for i in range(n):
            stride = s if i == 0 else 1
            with b.scope(f"features.{idx}"):
                hidden = c * t
                y = x
                if t != 1:
                    y = b.conv_bn(y, c, hidden, 1, act="relu6", name="expand")
                y = b.conv_bn(y, hidden, hidden, 3, stride, groups=hidden, act="relu6",
                              name="depthwise")
                residual = stride == 1 and c == cout
                y = b.conv_bn(y, hidden, cout, 1, act=None, name="project",
                              bn_gamma=RESIDUAL_BN_GAMMA if residual else 1.0)
                x = b.add(x, y) if residual else y
            c = cout
            idx += 1
    x = b.conv_bn(x, c, last, 1, act="relu6", name=f"features.{idx}")
    _classifier(b, x, last, num_classes)
    return b.build(cfg)


# ------------------------------------------------------------------------- DenseNet
def densenet(batch: int = 1, image: int = 224, num_classes: int = 1000,
             growth: int = 32, blocks: Sequence[int] = (6, 12, 24, 16),
             init_features: int = 64, bn_size: int = 4, seed: int = 0,
             name: str = "densenet121") -> onnx.ModelProto:
    """DenseNet-BC (torchvision layout; each dense layer concatenates all its inputs)."""
    blocks = tuple(blocks)
    cfg = dict(batch=batch, image=image, num_classes=num_classes, growth=growth,
               blocks=list(blocks), init_features=init_features, bn_size=bn_size, seed=seed)
    b = GraphBuilder(name, seed)
    x = _image_input(b, batch, image)
    with b.scope("features"):
        x = b.conv_bn(x, 3, init_features, 7, 2, 3, name="conv0")
        x = b.maxpool(x, 3, 2, 1)
    c = init_features
    for bi, n in enumerate(blocks):
        feats = [x]
        for li in range(n):
            with b.scope(f"denseblock{bi + 1}.denselayer{li + 1}"):
                cin = c + li * growth
                y = b.concat(feats, axis=1)
                y = b.relu(b.batchnorm(y, cin, name="norm1"))
                y = b.conv(y, cin, bn_size * growth, 1, name="conv1")
                y = b.relu(b.batchnorm(y, bn_size * growth, name="norm2"))
                y = b.conv(y, bn_size * growth, growth, 3, padding=1, name="conv2")
                feats.append(y)
        c += n * growth
        x = b.concat(feats, axis=1)
        if bi != len(blocks) - 1:
            with b.scope(f"transition{bi + 1}"):
                x = b.relu(b.batchnorm(x, c, name="norm"))
                x = b.conv(x, c, c // 2, 1, gain=1.0, name="conv")
                x = b.avgpool(x, 2, 2)
                c //= 2
    x = b.relu(b.batchnorm(x, c, name="features.norm5"))
    _classifier(b, x, c, num_classes)
    return b.build(cfg)


def densenet121(**kw) -> onnx.ModelProto:
    return densenet(**kw)
