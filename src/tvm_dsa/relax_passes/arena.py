"""Apply the memory allocation plan (seed 001 §4.4.1) to the executable: the intermediate tensors
of a function share one arena, each at the offset the peak-first plan gives it.

Runs after ``CallTIRRewrite`` (every kernel output is an ``R.builtin.alloc_tensor``) and before
Relax's ``StaticPlanBlockMemory``, which then leaves the planned tensors alone. Per function:

* *Lifetimes.* Steps count the bindings in program order, those of ``If`` branches included (the
  then branch's, then the else branch's; a read inside an If counts at the If's last step). A
  tensor lives from its allocation to the last step that reads it or anything that may alias it
  (a variable bound to it, a tuple holding it, a reshape view, an If whose branch returns it:
  every value that mentions it, except a call of a TIR kernel, which writes its outputs and
  returns nothing). The function's result lives to the end; it is planned too, as Relax's planner
  lets a result reuse an intermediate's storage (the caller holding the result keeps the arena).
* *Segments at nac points.* A ``match_cast`` that defines new symbols (a size known only when the
  program gets there: SoD2's nac points, §4.3) starts a new segment; each segment's tensors get
  their own arena, allocated just before its first tensor. (A tensor in a branch whose size uses
  a symbol the branch defines is left to Relax.)
* *The plan.* Sizes in bytes, rounded up to 64 (kernels assume aligned buffers), with lifetimes,
  go to ``memory_plan.peak_first``. All sizes known at compile time: the offsets are constants.
  Some symbolic: the plan is made at run time, once per distinct set of sizes, by the packed
  function ``tvm_dsa.arena_plan`` (the lifetimes are constants of the call); a ``match_cast`` binds
  the arena size and offsets it returns to fresh symbols that the allocations use — the seed's
  "动态DNN的内存规划只能在执行时当所有张量大小都已知时才能进行".

    mod = PlanArena(mod)   # in the dsa pipeline: after dataflow lowering, before finalization
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache

import tvm
import tvm_ffi
from tvm import relax, tirx

from .memory_plan import Lifetime, peak_first

ALIGN = 64
_ALLOC = tvm.ir.Op.get("relax.builtin.alloc_tensor")


@dataclass(frozen=True)
class _Tensor:
    """A planned tensor: its variable, size in bytes (a PrimExpr) and steps alive (inclusive)."""

    var: relax.Var
    size: tirx.PrimExpr
    first: int
    last: int


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN


def arena_offsets(lifetimes: tuple[tuple[int, int], ...], sizes: tuple[int, ...]) -> tuple[int, ...]:
    """(arena bytes, offset of each tensor) of the peak-first plan for tensors of ``sizes`` bytes
    alive over the inclusive step ranges ``lifetimes``."""
    plan = peak_first([Lifetime(_aligned(s), a, b) for s, (a, b) in zip(sizes, lifetimes)])
    return (max(plan.peak, 1), *plan.offsets)


@lru_cache(maxsize=1024)
def _arena_plan(lifetimes_text: str, sizes: tuple[int, ...]) -> tuple[int, ...]:
    return arena_offsets(tuple(map(tuple, json.loads(lifetimes_text))), sizes)


def arena_plan(lifetimes_text, sizes) -> tvm_ffi.Shape:
    """The packed function a plan with symbolic sizes calls at run time (cached per sizes)."""
    return tvm_ffi.Shape(_arena_plan(str(lifetimes_text), tuple(int(s) for s in sizes)))


def _is_alloc(value) -> bool:
    return isinstance(value, relax.Call) and value.op.same_as(_ALLOC)


def _plannable(value) -> bool:
    """A global-scope allocation on device 0 whose shape is a ShapeExpr."""
    shape, _, device, scope = value.args
    return (isinstance(shape, relax.ShapeExpr) and int(device.value) == 0 and scope.value == "global")


def tensor_bytes(shape, dtype, analyzer=None) -> tirx.PrimExpr:
    """Bytes of a tensor of ``shape`` (PrimExprs) and ``dtype``, simplified by ``analyzer``."""
    dtype = tvm.DataType(str(dtype))
    size = tirx.IntImm("int64", (dtype.bits * dtype.lanes + 7) // 8)
    for d in shape:
        size = size * d
    return (analyzer or tvm.sym.Analyzer()).simplify(size)


def _held(expr, holds: dict) -> set:
    """The allocations the variables ``expr`` mentions may refer to."""
    return set().union(*(holds.get(v, set()) for v in relax.analysis.free_vars(expr)))


def _writes_only(value, mod: tvm.IRModule) -> bool:
    """A call of a TIR kernel: it writes into its output arguments and returns nothing."""
    return (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)
            and isinstance(mod[value.op], tirx.PrimFunc))


def _defines_symbols(binding, defined: set) -> set:
    if not isinstance(binding, relax.MatchCast):
        return set()
    return {v for v in relax.analysis.definable_tir_vars_in_type(binding.ty) if v not in defined}


class _Planner:
    """Plans one function: its body is cut into segments at the symbol-defining casts; each
    segment's allocations, those in the If branches inside it included, share an arena."""

    def __init__(self, mod: tvm.IRModule):
        self.mod = mod
        self.arenas = 0

    def function(self, func: relax.Function) -> relax.Function:
        body = func.body
        if any(isinstance(block, relax.DataflowBlock) for block in body.blocks):
            return func  # this pass runs after dataflow lowering; leave anything else as it is
        bindings = [b for block in body.blocks for b in block.bindings]
        tensors = self.lifetimes(bindings, body.body)
        segments = [[]]
        scope = {v for p in func.params for v in relax.analysis.definable_tir_vars_in_type(p.ty)}
        for b in bindings:
            new = _defines_symbols(b, scope)
            if new:
                segments.append([])
            scope |= new
            # an allocation joins the arena if its size is computable where the segment starts
            segments[-1] += [t for t in tensors.get(b.var, []) if set(tirx.analysis.undefined_vars(t.size)) <= scope]
        replace, heads = {}, {}
        for members in segments:
            if len(members) >= 2:
                head, allocs = self.arena(members)
                replace.update(allocs)
                heads[members[0].var] = head
        if not replace:
            return func
        out = []
        for b in bindings:
            # the arena comes before the top-level binding that holds (or is) its first tensor
            for t in tensors.get(b.var, []):
                out += heads.get(t.var, [])
            out += self.rewrite(b, replace)
        return relax.Function(func.params, relax.SeqExpr([relax.BindingBlock(out)], body.body),
                              func.ret_ty, func.is_pure, func.attrs, func.span)

    def lifetimes(self, bindings: list, result) -> dict:
        """Top-level variable -> the plannable allocations made in its binding (itself, or those
        inside an If's branches), with the steps they live. Steps count bindings in program
        order, the branches' bindings included (the then branch's, then the else branch's); a
        read inside an If counts at the If's last step."""
        holds: dict = {}  # var -> the allocations it may refer to
        found: dict = {}  # allocation var -> [size, first, last]
        step = self.walk(bindings, holds, found, 0)
        for v in _held(result, holds):
            found[v][2] = step
        tensors: dict = {}
        for b in bindings:
            inner = [b.var] if b.var in found else [v for v in found if v in _bound_in(b)]
            tensors[b.var] = [_Tensor(v, *found[v]) for v in inner]
        return tensors

    def walk(self, bindings: list, holds: dict, found: dict, step: int) -> int:
        for b in bindings:
            value = b.value
            if isinstance(b, relax.VarBinding) and _is_alloc(value) and _plannable(value):
                holds[b.var] = {b.var}
                found[b.var] = [tensor_bytes(value.args[0].values, value.args[1].value), step, step]
                step += 1
                continue
            end = step
            if isinstance(value, relax.If):
                held = set()
                for branch in (value.true_branch, value.false_branch):
                    inner = dict(holds)
                    end = self.walk([x for block in branch.blocks for x in block.bindings], inner, found, end)
                    for v in _held(branch.body, inner):
                        found[v][2] = max(found[v][2], end)
                    held |= _held(branch.body, inner)
            elif _writes_only(value, self.mod):
                held = set()
            else:
                held = _held(value, holds)
            for v in _held(value, holds):
                found[v][2] = max(found[v][2], end)
            if held:
                holds[b.var] = held
            step = end + 1
        return step

    def arena(self, tensors: list[_Tensor]) -> tuple[list, dict]:
        """The bindings that allocate an arena for ``tensors`` (and plan it at run time where
        their sizes are symbolic), and the allocation that replaces each tensor's."""
        name = f"arena{self.arenas}"
        self.arenas += 1
        spans = [(t.first, t.last) for t in tensors]
        if all(isinstance(t.size, tirx.IntImm) for t in tensors):
            total, *offsets = arena_offsets(tuple(spans), tuple(int(t.size) for t in tensors))
            head = []
        else:
            plan_var = relax.Var(f"{name}_plan", relax.ShapeType(ndim=len(tensors) + 1))
            symbols = [tirx.Var(f"{name}_{k}", "int64") for k in range(len(tensors) + 1)]
            call = relax.Call(relax.ExternFunc("tvm_dsa.arena_plan"),
                              [tvm.ir.StringImm(json.dumps(spans)), relax.ShapeExpr([t.size for t in tensors])],
                              None, [relax.ShapeType(ndim=len(tensors) + 1)])
            head = [relax.VarBinding(plan_var, call),
                    relax.MatchCast(relax.Var(f"{name}_bound", relax.ShapeType(symbols)), plan_var,
                                    relax.ShapeType(symbols))]
            total, *offsets = symbols
        storage = relax.Var(name, relax.ObjectType())
        head.append(relax.VarBinding(storage, relax.op.memory.alloc_storage(
            relax.ShapeExpr([total]), 0, "global", "uint8")))
        return head, {t.var: (storage, offset) for t, offset in zip(tensors, offsets)}

    def rewrite(self, binding, replace: dict) -> list:
        """``binding`` with the planned allocations in it (in If branches too) carved from their arena."""
        value = binding.value
        if binding.var in replace:
            storage, offset = replace[binding.var]
            shape, dtype = value.args[0], value.args[1]
            # kernels take tensors with a zero byte_offset: ensure_zero_offset moves the offset
            # into the data pointer (no copy on the host, the offset being 64-byte aligned)
            at = relax.Var(f"{binding.var.name}_at", binding.var.ty)
            return [relax.VarBinding(at, relax.op.memory.alloc_tensor(
                        storage, tirx.IntImm("int64", offset) if isinstance(offset, int) else offset,
                        shape, dtype.value, 0)),
                    relax.VarBinding(binding.var, relax.op.memory.ensure_zero_offset(at))]
        if isinstance(value, relax.If):
            branches = [relax.SeqExpr([relax.BindingBlock([x for block in br.blocks for b in block.bindings
                                                           for x in self.rewrite(b, replace)])], br.body)
                        for br in (value.true_branch, value.false_branch)]
            return [relax.VarBinding(binding.var, relax.If(value.cond, *branches))]
        return [binding]


def _bound_in(binding) -> set:
    """Variables bound inside an If binding's branches."""
    out = set()
    if isinstance(binding.value, relax.If):
        for br in (binding.value.true_branch, binding.value.false_branch):
            for b in (b for block in br.blocks for b in block.bindings):
                out |= {b.var} | _bound_in(b)
    return out


@tvm.transform.module_pass(opt_level=0, name="dsa.PlanArena")
def PlanArena(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    planner = _Planner(mod)
    updates = {gv: planner.function(f) for gv, f in mod.functions.items() if isinstance(f, relax.Function)}
    mod = mod.clone()  # the caller's module stays as it is
    for gv, f in updates.items():
        mod[gv] = f
    return mod
