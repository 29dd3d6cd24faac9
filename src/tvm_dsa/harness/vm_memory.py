"""What a Relax VM run actually allocates: every ``vm.builtin.alloc_storage`` call of the run, and
the most bytes of storage alive at once (seed 001's "peak memory" of an executable, measured).

    stats = measure(vm, "main", tvm.runtime.tensor(x))
    stats.peak, stats.total, stats.count

Every storage the VM allocates (``LowerAllocTensor`` turns each tensor allocation into one) is
seen through the VM's instrument hook, and is alive while anything holds it: a register, a tensor
carved from it, a view of that tensor, the function's result. After every VM call, a storage that
only this measurement still holds (its strong reference count, read from the FFI object header,
is 1) is counted as freed. Inputs and constants are not allocated by the run and not counted."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import tvm_ffi


@dataclass(frozen=True)
class Allocations:
    """``peak``: most storage bytes alive at once; ``total``: bytes of all storage allocated;
    ``count``: storage allocations."""

    peak: int
    total: int
    count: int


def _strong_refs(obj) -> int:
    # TVMFFIObject starts with combined_ref_count: strong count in the low 32 bits (c_api.h)
    return ctypes.c_uint64.from_address(obj.__chandle__()).value & 0xFFFFFFFF


def measure(vm, func: str, *args) -> Allocations:
    """Run ``vm[func](*args)`` once and return its storage allocations (the result is dropped)."""
    live: dict[int, tuple] = {}
    peak, total, count = 0, 0, 0

    def instrument(_func, symbol, before, ret, *call_args):
        nonlocal peak, total, count
        if before:
            return 0
        for handle, (storage, _) in list(live.items()):
            if _strong_refs(storage) == 1:
                del live[handle]
        if symbol == "vm.builtin.alloc_storage":
            size = int(call_args[1][0])
            live[ret.__chandle__()] = (ret, size)
            total, count = total + size, count + 1
            peak = max(peak, sum(s for _, s in live.values()))
        return 0

    vm.set_instrument(tvm_ffi.convert(instrument))
    try:
        vm[func](*args)
    finally:
        vm.set_instrument(None)
    return Allocations(peak, total, count)
