"""Event-driven timing of a program: per-unit in-order queues, dependency tokens, shared bandwidth.

Every unit (per core ``dma``, ``mme``, ``vme``, ``vec``; per cluster ``cdma``) runs its instructions
in list order, one at a time. An instruction starts when it is its unit's next one, the unit is
free and all its ``deps`` have finished; at that moment every earlier instruction it conflicts with
in memory must have finished too, otherwise ``HazardError``. Compute instructions take
``compute_cycles``. Transfers wait their fixed latency, then share bandwidth as a fluid: at every
change of the set of moving transfers, each one's rate is the minimum over its resources of the
resource's bandwidth divided among the transfers using it. A transfer completes at the first whole
cycle after its last byte. The multicast DMAs of one transfer (``isa.multicast_groups``) wait at
their queues' heads until all of them may start, then move as one transfer (the source read once,
each destination written) and finish together. On chips with ``dma_run_ahead`` a DMA queue starts
its next transfer's latency once the current one moves its data; the next moves when the current
has finished (a multicast when every queue it is on has), so data still moves in queue order.
Kernels run one after another: each starts once the one before has finished on all cores, after
``kernel_launch_cycles`` unless it is chained to it (``Kernel.chained``: one launch, a barrier on the chip).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from tvm_dsa.hardware.model import Hardware
from tvm_dsa.isa.instructions import OPCODE_OF, Dma, Fill, Mme, multicast_groups
from tvm_dsa.isa.program import Kernel, Program
from tvm_dsa.runtime.cost import bandwidth, compute_cycles, dma_demand, dma_latency
from tvm_dsa.runtime.hazards import HazardError, HazardTracker, exact_conflict

_FINISH, _MOVE = 0, 1  # events: an instruction finished; a transfer's latency is over
_EPS = 1e-6  # cycles: a transfer this close to done is done


@dataclass
class KernelTiming:
    """When each instruction of a kernel ran, in cycles from the kernel's start."""

    name: str
    start_cycle: int  # the kernel's start within the program (after its launch)
    cycles: int
    units: list[tuple[str, int]]  # unit of each instruction
    start: list[int]
    end: list[int]
    order: list[int]  # instruction indices in the order they started
    riders: frozenset = frozenset()  # multicast DMAs that moved in another's transfer (no source read of their own)

    def shown(self) -> list[int]:
        """When each instruction occupies its unit from: its start, or where a run-ahead DMA queue
        set it up while the transfer before it moved (``Hardware.dma_run_ahead``), that transfer's
        end. A unit's busy time and trace track then count no cycle twice."""
        out, last = [], {}
        for u, s, e in zip(self.units, self.start, self.end):
            out.append(min(max(s, last.get(u, 0)), e))
            last[u] = max(last.get(u, 0), e)
        return out


@dataclass
class ProgramTiming:
    kernels: list[KernelTiming]
    cycles: int


def simulate_program(program: Program, hw: Hardware, check_hazards: bool = True) -> ProgramTiming:
    """Time every kernel in sequence; raises ``HazardError`` on a missing dependency token
    (``check_hazards=False`` trusts the tokens: the check costs more than the timing on programs
    with many strided DDR tiles)."""
    program = program.expanded()
    tracker = HazardTracker({"ddr": program.ddr_bytes, "gb": hw.gb_bytes, "lb": hw.lb_bytes}) if check_hazards else None
    costs = _Costs(hw)
    kernels, t = [], 0
    for k in program.kernels:
        t += 0 if k.chained else hw.kernel_launch_cycles
        kernels.append(simulate_kernel(k, hw, tracker, t, costs))
        t += kernels[-1].cycles
    return ProgramTiming(kernels, t)


class _Costs:
    """Cost of instructions by what it depends on (the box, units, memories and strides, not the
    offsets), computed once per distinct key. Transfers: (latency, ((resource id, full-speed rate
    as a fraction of the transfer per cycle), ...)); resource ids are shared by all kernels."""

    def __init__(self, hw: Hardware):
        self.hw = hw
        self.cache: dict = {}
        self.resource_ids: dict[tuple, int] = {}

    def unit_and_cost(self, ins) -> tuple[tuple[str, int], object]:
        kind = type(ins)
        core = ins.core
        if kind is Dma:
            d, s = ins.dst, ins.src
            if d.mem != "lb" and s.mem != "lb":
                unit = ("cdma", core // self.hw.cores_per_cluster)
            else:
                unit = ("pdma" if ins.prefetch else "dma", core)
            key = (kind, ins.shape, d.mem, d.index, d.dtype, d.strides, s.mem, s.index, s.dtype, s.strides)
        elif kind is Fill:
            unit = ("dma", core)
            key = (kind, ins.shape, ins.dst.mem, ins.dst.index, ins.dst.dtype)
        elif kind is Mme:
            unit = ("mme", core)
            key = (kind, ins.shape, ins.reduce, ins.a.strides, ins.b.strides)
        else:
            unit = (ins.unit, core)
            key = (kind, ins.unit, ins.shape)
        cost = self.cache.get(key)
        if cost is None:
            cost = self.cache[key] = self._cost(ins)
        return unit, cost

    def multicast(self, members: list) -> tuple:
        """The cost of one transfer of multicast DMAs ``members`` (the first reads the source):
        the longest latency, the source once, each member's destination, and each resource on the
        way (a mesh link, a GB a bus crosses) once: a multicast tree, the union of the routes."""
        key = (self.unit_and_cost(members[0])[1], tuple(m.dst.index for m in members))
        cost = self.cache.get(key)
        if cost is None:
            hw, ids = self.hw, self.resource_ids
            demand = dma_demand(members[0], hw)
            source = (members[0].src.mem,) if members[0].src.mem == "ddr" else (members[0].src.mem, members[0].src.index)
            for m in members[1:]:
                mine = (m.dst.mem, m.dst.index)
                for r, b in dma_demand(m, hw).items():
                    if r == mine:
                        demand[r] = demand.get(r, 0) + b
                    elif r != source:
                        demand.setdefault(r, b)
            rates = tuple((ids.setdefault(r, len(ids)), bandwidth(r, hw) / b) for r, b in demand.items())
            cost = self.cache[key] = (max(dma_latency(m, hw) for m in members), rates)
        return cost

    def _cost(self, ins):
        hw = self.hw
        if isinstance(ins, (Dma, Fill)):
            ids = self.resource_ids
            rates = tuple((ids.setdefault(r, len(ids)), bandwidth(r, hw) / b) for r, b in dma_demand(ins, hw).items())
            return dma_latency(ins, hw), rates
        return compute_cycles(ins, hw)


def simulate_kernel(kernel: Kernel, hw: Hardware, tracker: HazardTracker | None, start_cycle: int = 0,
                    costs: _Costs | None = None) -> KernelTiming:
    """Time one kernel; ``tracker`` (None: no check) finds the instructions each must follow."""
    costs = costs or _Costs(hw)
    instrs = kernel.instructions
    n = len(instrs)
    unit_ids: dict[tuple[str, int], int] = {}
    units: list[tuple[str, int]] = []
    uid = [0] * n
    queues: list[list[int]] = []
    cost: list = [None] * n  # compute: cycles; transfer: (latency, ((resource, full-speed rate), ...))
    pending = [0] * n
    dependents: list[list[int]] = [[] for _ in range(n)]
    conflicts: list[tuple[int, ...]] = [()] * n
    unit_and_cost = costs.unit_and_cost
    if tracker is not None:
        tracker.begin_kernel()
    for i, ins in enumerate(instrs):
        u, cost[i] = unit_and_cost(ins)
        units.append(u)
        q = unit_ids.get(u)
        if q is None:
            q = unit_ids[u] = len(queues)
            queues.append([])
        uid[i] = q
        queues[q].append(i)
        deps = ins.deps
        if len(deps) > 1:
            deps = set(deps)
        pending[i] = len(deps)
        for d in deps:
            dependents[d].append(i)
        if tracker is not None:
            conflicts[i] = tracker.add(ins, q)

    start, end, order = [0] * n, [0] * n, []
    done = [False] * n
    busy = [False] * len(queues)  # the queue's next instruction may not start
    ahead = [hw.dma_run_ahead and name in ("dma", "pdma", "cdma") for name, _ in unit_ids]
    data = [-1] * len(queues)  # the transfer a run-ahead queue moves the data of
    parked = [-1] * len(queues)  # the queue's next transfer, its latency over, waiting for that one
    on_queues: dict[int, tuple[int, ...]] = {}  # a run-ahead transfer moving -> its queues
    pos = [0] * len(queues)
    users = [0] * len(costs.resource_ids)
    moving: dict[int, list] = {}  # transfer -> [remaining fraction, rate]
    heap: list[tuple[int, int, int, int]] = []
    seq = 0
    t_moving = 0.0  # time at which the remaining fractions are exact
    next_done = math.inf  # earliest time a moving transfer finishes
    groups = {i: g for i, g in multicast_groups(instrs).items() if len(g) > 1}
    waiting: set[int] = set()  # multicast DMAs at their queue's head until their transfer's others are
    riding: dict[int, tuple[int, ...]] = {}  # a multicast transfer's first DMA -> the others, finishing with it
    shared: dict[int, tuple] = {}  # a multicast transfer's first DMA -> its resources' rates, until it moves

    def begin(i: int, t: int) -> None:
        """``i`` (its unit's next, its deps done) starts at ``t``, after the hazard check (an
        earlier transfer of a run-ahead queue finishes before ``i`` moves its data)."""
        u = uid[i]
        for j in conflicts[i]:
            if not done[j] and not (ahead[u] and uid[j] == u):
                found = exact_conflict(instrs[j], instrs[i])
                if found:
                    kind, o = found
                    raise HazardError(
                        f"kernel {kernel.name!r}: instruction {i} ({OPCODE_OF[type(instrs[i])]}) starts at "
                        f"cycle {t} before instruction {j} ({OPCODE_OF[type(instrs[j])]}) finished, but it "
                        f"must follow it ({kind} on {o.mem}[{o.index}]): add {j} to the deps of {i}")
        busy[u] = True
        pos[u] += 1
        start[i] = t
        order.append(i)

    def try_start(u: int, t: int) -> None:
        nonlocal seq
        q, p = queues[u], pos[u]
        if busy[u] or p == len(q) or pending[q[p]]:
            return
        i = q[p]
        members = groups.get(i)
        if members is not None:
            waiting.add(i)
            if not waiting.issuperset(members):
                return
            waiting.difference_update(members)
            for m in members:
                begin(m, t)
            riding[members[0]] = members[1:]
            c = costs.multicast([instrs[m] for m in members])
            shared[members[0]] = c[1]
            seq += 1
            heapq.heappush(heap, (t + c[0], seq, _MOVE, members[0]))
            return
        begin(i, t)
        c = cost[i]
        seq += 1
        if isinstance(c, int):
            heapq.heappush(heap, (t + c, seq, _FINISH, i))
        else:
            heapq.heappush(heap, (t + c[0], seq, _MOVE, i))

    def move(i: int, ready: list, joining: list) -> None:
        """Transfer ``i`` (latency over) on run-ahead queues: it moves when none of its queues
        moves another's data, and its queues then start their next transfers' latencies."""
        qs = (uid[i], *(uid[r] for r in riding.get(i, ())))
        if any(data[q] >= 0 for q in qs):
            for q in qs:
                parked[q] = i
            return
        on_queues[i] = qs
        joining.append(i)
        for q in qs:
            data[q], parked[q], busy[q] = i, -1, False
            ready.append(q)

    def finish(i: int, t: int, ready: list, joining: list) -> None:
        done[i] = True
        end[i] = t
        u = uid[i]
        if not ahead[u]:
            busy[u] = False
        elif i in on_queues:  # the queues' transfers set up behind it may move
            qs = on_queues.pop(i)
            for q in qs:
                data[q] = -1
            for j in dict.fromkeys(parked[q] for q in qs if parked[q] >= 0):
                move(j, ready, joining)
        ready.append(u)
        for d in dependents[i]:
            pending[d] -= 1
            if not pending[d]:
                ready.append(uid[d])

    def advance(t: float) -> None:
        nonlocal t_moving
        dt = t - t_moving
        for m in moving.values():
            m[0] -= m[1] * dt
        t_moving = t

    def rebalance(t: float) -> None:
        nonlocal next_done
        next_done = math.inf
        for i, m in moving.items():
            m[1] = min(f / users[r] for r, f in rates[i])
            next_done = min(next_done, t + m[0] / m[1])

    rates: dict[int, tuple] = {}  # moving transfer -> its resources' (id, full-speed rate)
    for u in range(len(queues)):
        try_start(u, 0)
    t = 0
    while True:
        while heap or moving:
            t_event = heap[0][0] if heap else math.inf
            if next_done <= t_event:  # some transfer moved its last byte
                t = next_done
                advance(t)
                for i in [i for i, m in moving.items() if m[0] <= m[1] * _EPS]:  # < _EPS cycles left
                    del moving[i]
                    for r, _ in rates.pop(i):
                        users[r] -= 1
                    seq += 1
                    heapq.heappush(heap, (math.ceil(t - _EPS), seq, _FINISH, i))
                rebalance(t)
                continue
            t = t_event
            ready: list[int] = []
            joining: list[int] = []
            while heap and heap[0][0] == t:
                _, _, kind, i = heapq.heappop(heap)
                if kind == _MOVE:
                    if ahead[uid[i]]:
                        move(i, ready, joining)
                    else:
                        joining.append(i)
                    continue
                finish(i, t, ready, joining)
                for r in riding.get(i, ()):
                    finish(r, t, ready, joining)
            if joining:
                advance(t)
                for i in joining:
                    moving[i] = [1.0, 0.0]
                    rates[i] = shared.pop(i) if i in shared else cost[i][1]
                    for r, _ in rates[i]:
                        users[r] += 1
                rebalance(t)
            for u in ready:
                try_start(u, t)
        if not waiting:
            break
        # a multicast DMA whose transfer's others cannot come (each waits on something behind
        # another's): they move alone, each reading its source
        alone = sorted(waiting)
        waiting.clear()
        for i in alone:
            for m in groups.pop(i, ()):
                groups.pop(m, None)
        for i in alone:
            try_start(uid[i], t)

    return KernelTiming(kernel.name, start_cycle, max(end, default=0), units, start, end, order,
                        frozenset(r for rs in riding.values() for r in rs))
