"""One-layer kernels (``LayerPlan``): a lowered PrimFunc's program, every tensor in DDR."""

from __future__ import annotations

from tvm_dsa.emit.emitter import build_program
from tvm_dsa.isa.validation import validate
from tvm_dsa.kernelgen.rewrite import DSACall


def layer_program(lowered, hw, name: str):
    """The one-layer program of a lowered kernel, validated now (an invalid program's kernel runs
    on the host, not the model's run into an error)."""
    program = build_program(lowered, hw, name)
    validate(program)
    return program


class LayerKernels:
    """The generator of ``LayerPlan`` kernels over a ``Lowered`` module: one program per PrimFunc,
    however many calls run it."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.programs: dict = {}  # PrimFunc name -> program text

    def __call__(self, spec) -> DSACall:
        ctx = self.ctx
        (node,) = ctx.nodes(spec)
        if node.func not in self.programs:
            program = ctx.built.get(node.func) or layer_program(ctx.lowered[node.func][0], ctx.hw, node.func)
            self.programs[node.func] = program.serialize()
            ctx.result.dsa.append(node.func)
        return DSACall(spec, self.programs[node.func], node.inputs, (node.output,))
