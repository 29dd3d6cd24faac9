"""The ``dsa.`` patterns: the groups of Relax ops that the ``dsa`` pipeline's fusion (TVM's
``FuseOps`` after legalization) makes one kernel of, written as patterns, longest first.

- an anchor (convolution, matmul) with the element-wise chain after it (bias, batch norm,
  residual add, activation, ...): ``FuseOps`` fuses the element-wise ops after an
  out-element-wise-fusable op;
- a matmul with bias and GELU (``x * (1 + erf(x / c)) * 0.5``, whose ``x`` feeds two ops);
- a reduction, pooling or normalisation alone;
- a transpose with the reshapes around it (a DSA copy kernel);
- an element-wise chain alone.

A match may not leak an intermediate value (one used outside it), as ``FuseOps`` would then cut
the group there too. The ``dsa`` pipeline folds batch norms into the convolutions before it
fuses; ``byoc.partition.partition_for_dsa`` does the same before it matches."""

from __future__ import annotations

import functools

from tvm import relax
from tvm.relax.backend.pattern_registry import register_patterns
from tvm.relax.backend.utils import has_leaking_intermediate_variables
from tvm.relax.dpl import DFPattern, is_op, is_tuple_get_item, wildcard

PREFIX = "dsa"
LONGEST = 6  # element-wise ops after an anchor in one pattern (ResNet: batch norm, add, relu)
ANCHORS = {"conv1d": "relax.nn.conv1d", "conv2d": "relax.nn.conv2d", "matmul": "relax.matmul"}
ALONE = {"max_pool2d": "relax.nn.max_pool2d", "avg_pool2d": "relax.nn.avg_pool2d",
         "adaptive_avg_pool2d": "relax.nn.adaptive_avg_pool2d", "mean": "relax.mean", "sum": "relax.sum",
         "max": "relax.max", "softmax": "relax.nn.softmax", "layer_norm": "relax.nn.layer_norm"}
UNARY = ("relax.nn.relu", "relax.clip", "relax.sigmoid", "relax.tanh", "relax.erf", "relax.exp", "relax.sqrt",
         "relax.nn.gelu", "relax.nn.silu", "relax.negative")
BINARY = ("relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.maximum", "relax.minimum")


def _either(op: str, a: DFPattern, b: DFPattern) -> DFPattern:
    return is_op(op)(a, b) | is_op(op)(b, a)


def _any(ops) -> DFPattern:
    return functools.reduce(lambda a, b: a | b, (is_op(op) for op in ops))


def _elementwise(x: DFPattern) -> DFPattern:
    """One element-wise op applied to ``x``: unary, binary with any other operand, or a batch norm's
    output."""
    binary = _any(BINARY)
    return (_any(UNARY)(x, varg_default_wildcard=True) | binary(x, wildcard()) | binary(wildcard(), x)
            | is_tuple_get_item(is_op("relax.nn.batch_norm")(x, wildcard(), wildcard(), wildcard(), wildcard()), 0))


def _chains(x: DFPattern) -> list[DFPattern]:
    """``x``, then ``x`` followed by 1, 2, ... ``LONGEST`` element-wise ops, longest first (each
    pattern built on the one before)."""
    found = [x]
    for _ in range(LONGEST):
        found.append(_elementwise(found[-1]))
    return found[::-1]


def _gelu() -> DFPattern:
    x = is_op("relax.add")(is_op("relax.matmul")(wildcard(), wildcard()), wildcard())
    erf = is_op("relax.erf")(is_op("relax.divide")(x, wildcard()))
    return _either("relax.multiply", _either("relax.multiply", x, is_op("relax.add")(erf, wildcard())), wildcard())


def _transpose() -> DFPattern:
    reshaped = is_op("relax.reshape")(wildcard(), wildcard())
    moved = is_op("relax.permute_dims")(reshaped | wildcard())
    return is_op("relax.reshape")(moved, wildcard()) | moved


def _check(context) -> bool:
    """No intermediate value leaks, and a tensor of the model flows in: ops on constants alone are
    the build's to fold."""
    inside = set(context.matched_bindings.keys())
    inputs = [a for value in context.matched_bindings.values() if isinstance(value, relax.Call) for a in value.args
              if isinstance(a, relax.Var) and a not in inside]
    return bool(inputs) and not has_leaking_intermediate_variables(context)


def patterns() -> list[tuple]:
    """``(name, pattern, {}, check)`` for ``FuseOpsByPattern``, in priority order."""
    chains = {name: _chains(is_op(op)(wildcard(), wildcard())) for name, op in ANCHORS.items()}
    found = [(f"{PREFIX}.matmul_bias_gelu", _gelu())]
    for i, length in enumerate(range(LONGEST, -1, -1)):
        found += [(f"{PREFIX}.{name}_{length}", chain[i]) for name, chain in chains.items()]
    found += [(f"{PREFIX}.{name}", is_op(op)(wildcard(), varg_default_wildcard=True)) for name, op in ALONE.items()]
    found.append((f"{PREFIX}.transpose", _transpose()))
    found += [(f"{PREFIX}.elementwise_{length + 1}", chain)
              for length, chain in zip(range(LONGEST - 1, -1, -1), _chains(_elementwise(wildcard()))[1:])]
    return [(name, pattern, {}, _check) for name, pattern in found]


def register() -> None:
    """Put the patterns in TVM's pattern registry (``get_patterns_with_prefix("dsa")`` gives them
    in priority order; the registry ranks the later registered first)."""
    register_patterns(patterns()[::-1])
