"""Apply the memory allocation plan (seed 001 §4.4.1) to the executable: the intermediate tensors
of a function share one arena, each at the offset the best greedy plan gives it (``memory_plan.best_greedy``).

Runs after ``CallTIRRewrite`` (every kernel output is an ``R.builtin.alloc_tensor``) and before
Relax's ``StaticPlanBlockMemory``, which then leaves the planned tensors alone. Per function:

* *Lifetimes.* Steps count the bindings in program order, those of ``If`` branches included (the
  then branch's, then the else branch's; a read inside an If counts at the If's last step). A
  tensor lives from its allocation to the last step that reads it or anything that may alias it
  (a variable bound to it, a tuple holding it, a reshape view, an If whose branch returns it:
  every value that mentions it, except a kernel call, which writes its outputs and returns
  nothing). The function's result lives to the end; it is planned too, as Relax's planner lets a
  result reuse an intermediate's storage (the caller holding the result keeps the arena).
* *In place.* A kernel's output shares the bytes of an input it is elementwise on
  (``inplace.elementwise_inputs``, decided from the kernel's TIR: a host kernel's PrimFunc, or
  the one a DSA kernel with symbolic dims carries) when no value in those bytes is read after the
  call on a path through it: the two become one tensor, alive from the first's allocation to the
  last's last read. Paths matter at an ``If``: a branch may overwrite what the other branch
  returns. A DSA kernel's output may also take the bytes of an input it reads by rows
  (``inplace.row_inputs``: a softmax, a matmul whose rows keep their length) where the row's
  length is static and the kernel lowers with whole rows at the probe size; its programs are then
  built with no tile splitting a row (``SymbolicKernel.whole_rows``), so every row is read before
  it is written.
* *Segments at nac points.* A ``match_cast`` that defines new symbols (a size known only when the
  program gets there: SoD2's nac points, §4.3) starts a new segment; a tensor joins the arena of
  the first segment where its size is computable, allocated just before that segment's first
  tensor. (A tensor in a branch whose size uses a symbol the branch defines is left to Relax.)
* *The plan.* Sizes in bytes, rounded up to 64 (kernels assume aligned buffers), with lifetimes,
  go to ``memory_plan.best_greedy`` (SoD2's peak-first among its orders). All sizes known at compile time: the offsets are constants.
  Some symbolic: the plan is made at run time, once per distinct set of sizes, by the packed
  function ``tvm_dsa.arena_plan`` (the lifetimes are constants of the call); a ``match_cast`` binds
  the arena size and offsets it returns to fresh symbols that the allocations use — the seed's
  "动态DNN的内存规划只能在执行时当所有张量大小都已知时才能进行".

    mod = PlanArena(mod)   # in the dsa pipeline: after dataflow lowering, before finalization
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import lru_cache

import tvm
import tvm_ffi
from tvm import relax, tirx

from tvm_dsa.kernelgen.specialize import SymbolicKernel, free_symbols
from tvm_dsa.kernel.analysis import Unsupported
from tvm_dsa.relax_passes.inplace import elementwise_inputs, row_inputs
from tvm_dsa.memory_plan import Lifetime, best_greedy
from tvm_dsa.kernelgen.symbolic import probe
from tvm_dsa.packed import ARENA_PLAN, EXECUTE_SHAPED

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
    """(arena bytes, offset of each tensor) of the ``best_greedy`` plan for tensors of ``sizes`` bytes
    alive over the inclusive step ranges ``lifetimes``."""
    plan = best_greedy([Lifetime(_aligned(s), a, b) for s, (a, b) in zip(sizes, lifetimes)])
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
        self.found: dict = {}  # allocation var -> [size, first, last] of the function planned
        self.calls: list = []  # its kernel calls in program order, with what their arguments hold
        self.whole_rows: set = set()  # the variables of DSA calls whose output overwrites a row input

    def function(self, func: relax.Function) -> relax.Function:
        body = func.body
        if any(isinstance(block, relax.DataflowBlock) for block in body.blocks):
            return func  # this pass runs after dataflow lowering; leave anything else as it is
        bindings = [b for block in body.blocks for b in block.bindings]
        tensors = self.lifetimes(bindings, body.body)
        segments = [[]]
        scopes = [{v for p in func.params for v in relax.analysis.definable_tir_vars_in_type(p.ty)}]
        for b in bindings:
            new = _defines_symbols(b, scopes[-1])
            if new:
                segments.append([])
                scopes.append(scopes[-1] | new)
            # an allocation joins the first arena where its size is computable (after a cut, a
            # size without the cut's symbols keeps to the arena before it)
            for t in tensors.get(b.var, []):
                k = next((k for k, scope in enumerate(scopes) if set(tirx.analysis.undefined_vars(t.size)) <= scope), None)
                if k is not None:
                    segments[k].append(t)
        where = {t.var: k for k, members in enumerate(segments) for t in members}
        group = self.in_place(bindings, body.body, where)
        replace, heads = {}, {}
        for members in segments:
            if len(members) >= 2:
                head, allocs = self.arena(_merged(members, group))
                replace.update({t.var: allocs[group.get(t.var, t.var)] for t in members})
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
        self.found, self.calls = found, []
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
            elif self.kernel(value) is not None:  # writes into its output arguments, returns nothing
                self.calls.append((b, {v: holds.get(v, set()) for v in relax.analysis.free_vars(value)}))
                held = set()
            else:
                held = _held(value, holds)
            for v in _held(value, holds):
                found[v][2] = max(found[v][2], end)
            if held:
                holds[b.var] = held
            step = end + 1
        return step

    def kernel(self, value):
        """(PrimFunc, its arguments) of a kernel call whose TIR is known: a host kernel, or a DSA
        kernel with symbolic dims (it carries its PrimFunc); None otherwise (a static DSA program
        carries no TIR to decide from)."""
        if not isinstance(value, relax.Call):
            return None
        if isinstance(value.op, tvm.ir.GlobalVar) and isinstance(self.mod[value.op], tirx.PrimFunc):
            return self.mod[value.op], list(value.args)
        if _is_shaped(value):
            return SymbolicKernel.deserialize(value.args[0].value).func, list(value.args[2:])
        return None

    def overwritable(self, value) -> list[int] | None:
        """Indices of the arguments a kernel call's output may overwrite, elementwise inputs first
        (then, for a DSA kernel that can keep its rows whole, row inputs), after the output's index;
        None when the kernel is not analysable."""
        func, args = self.kernel(value)
        elementwise = elementwise_inputs(func)
        if elementwise is None or len(args) != len(func.params):
            return None
        rows = row_inputs(func) if _is_shaped(value) else None
        more = sorted(rows[1] - elementwise[1]) if rows and _rows_keepable(value.args[0].value) else []
        return [elementwise[0], *sorted(elementwise[1]), *more]

    def in_place(self, bindings: list, result, where: dict) -> dict:
        """Allocation -> the first allocation of the group it shares bytes with. A kernel's
        output joins the group of an elementwise input (``inplace.elementwise_inputs``) when that
        input refers to one group only, of the output's size and in its arena, no other argument
        of the call refers to the group, and no value in the group is read after the call on a
        path through it (views, the result and an If that returns it included)."""
        group: dict = {}  # allocation -> the group's first allocation
        members: dict = {}  # first allocation -> the group's allocations
        analyzer = tvm.sym.Analyzer()
        for b, held in self.calls:
            decided = self.overwritable(b.value)
            if decided is None:
                continue
            _, args = self.kernel(b.value)
            out, inputs = args[decided[0]], decided[1:]
            if out not in where:
                continue
            for i in inputs:
                x = args[i]
                heads = {group.get(v, v) for v in held.get(x, set())} if isinstance(x, relax.Var) else set()
                if len(heads) != 1:
                    continue
                head = heads.pop()
                old = members.get(head, {head})
                others = [a for k, a in enumerate(args) if k != i and not (k in inputs and a.same_as(x))]
                if (all(where.get(v) == where[out] and analyzer.can_prove_equal(self.found[v][0], self.found[out][0])
                        for v in old)
                        and not any(held.get(a, set()) & old for a in others if isinstance(a, relax.Var))
                        and not _reads_after(bindings, result, b.var, old, self.kernel)):
                    members[head] = old | {out}
                    group.update({v: head for v in members[head]})
                    if i not in elementwise_inputs(self.kernel(b.value)[0])[1]:
                        self.whole_rows.add(b.var)
                    break
        return group

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
            call = relax.Call(relax.ExternFunc(ARENA_PLAN),
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
        """``binding`` with the planned allocations in it (in If branches too) carved from their
        arena, and a DSA call that overwrites a row input built with whole rows."""
        value = binding.value
        if binding.var in self.whole_rows:
            kernel = dataclasses.replace(SymbolicKernel.deserialize(value.args[0].value), whole_rows=True)
            args = [tvm.ir.StringImm(kernel.serialize()), *value.args[1:]]
            return [relax.VarBinding(binding.var, relax.Call(value.op, args, value.attrs, value.ty_args))]
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


def _is_shaped(value) -> bool:
    """Whether ``value`` calls a DSA kernel with symbolic dims (it carries its PrimFunc)."""
    return isinstance(value.op, relax.ExternFunc) and value.op.global_symbol == EXECUTE_SHAPED


@lru_cache(maxsize=256)
def _rows_keepable(text: str) -> bool:
    """Whether a DSA kernel with symbolic dims can be built with whole rows at every shape: its
    output's rows have a static length, and it lowers so at the probe size (a row's tile then
    never grows with the shape)."""
    kernel = SymbolicKernel.deserialize(text)
    out = kernel.func.params[elementwise_inputs(kernel.func)[0]]
    if not isinstance(out.ty.shape[-1], tirx.IntImm):
        return False
    try:
        dataclasses.replace(kernel, whole_rows=True).program(probe(free_symbols(kernel.func)))
    except Unsupported:
        return False
    return True


def _merged(members: list[_Tensor], group: dict) -> list[_Tensor]:
    """One tensor per group of ``members`` (sharing bytes): its first allocation, alive from its
    members' first step to their last."""
    spans: dict = {}
    for t in members:
        head = group.get(t.var, t.var)
        size, first, last = spans.get(head, (t.size, t.first, t.last))
        spans[head] = (size, min(first, t.first), max(last, t.last))
    return [_Tensor(v, *span) for v, span in spans.items()]


def _branch_bindings(seq) -> list:
    return [b for block in seq.blocks for b in block.bindings]


def _reads_after(bindings: list, result, call: relax.Var, old: set, kernel) -> bool:
    """Whether a value of the allocations ``old`` may be read after the binding of ``call`` on a
    path through it: by a later binding, an If's condition or either of its branches, or the
    function's result. Path-aware where it matters: an If whose branch holds the call continues
    with that branch only, so its result refers to what that branch returns."""

    def walk(bindings, holds, passed):
        for b in bindings:
            value = b.value
            if b.var.same_as(call):
                passed = True
            elif isinstance(value, relax.If):
                if passed and _held(value.cond, holds) & old:
                    return True, passed
                branches = [br for br in (value.true_branch, value.false_branch) if call in _bound_in_seq(br)]
                held, after = set(), passed
                for br in branches or (value.true_branch, value.false_branch):
                    inner = dict(holds)
                    read, through = walk(_branch_bindings(br), inner, passed)
                    if read:
                        return True, True
                    held |= _held(br.body, inner)
                    after = after or through
                passed = after
                if held:
                    holds[b.var] = held
            elif _is_alloc(value) and _plannable(value):
                holds[b.var] = {b.var}
            else:
                if passed and _held(value, holds) & old:
                    return True, passed
                if kernel(value) is None:
                    held = _held(value, holds)
                    if held:
                        holds[b.var] = held
        return False, passed

    holds: dict = {}
    read, passed = walk(bindings, holds, False)
    return read or (passed and bool(_held(result, holds) & old))


def _bound_in_seq(seq) -> set:
    """Variables bound in a branch (a SeqExpr), nested Ifs included."""
    out = set()
    for b in _branch_bindings(seq):
        out |= {b.var} | _bound_in(b)
    return out


def _bound_in(binding) -> set:
    """Variables bound inside an If binding's branches."""
    if isinstance(binding.value, relax.If):
        return _bound_in_seq(binding.value.true_branch) | _bound_in_seq(binding.value.false_branch)
    return set()


@tvm.transform.module_pass(opt_level=0, name="dsa.PlanArena")
def PlanArena(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802 (a pass, named like TVM's)
    planner = _Planner(mod)
    updates = {gv: planner.function(f) for gv, f in mod.functions.items() if isinstance(f, relax.Function)}
    mod = mod.clone()  # the caller's module stays as it is
    for gv, f in updates.items():
        mod[gv] = f
    return mod
