"""Pre-tuned records shipped with the package (seed 004's TopHub): one database per chip preset
under ``tuning/records/<preset>/``, holding the best record of each benchmark kernel tuned on it.
The ``dsa`` pipeline consults the target's preset's records when no database is given
(``pipeline(database=False)`` turns them off); ``benchmarks/pretune.py`` fills them with
``merge_records``.

The two files of a meta-schedule JSON database are stored xz-compressed (``FILES``): a workload
line is TVM's serialized PrimFunc, 27 MB for stcp920's 321 kernels; their lines repeat each
other's structure beyond gzip's 32 KB window, so xz's 64 MB dictionary takes them to 0.4 MB
(gzip: 1.8 MB).
Records that only repeat the default tiling are kept: replaying one compiles faster than the
default's search of tilings (tiny ResNet-50: 1.0 s instead of 2.4 s).
"""

from __future__ import annotations

import functools
import json
import lzma
import os
import shutil
import tempfile
from pathlib import Path

import tvm_ffi
from tvm.s_tir import meta_schedule as ms

from tvm_dsa import hardware
from tvm_dsa.kernel.analysis import Unsupported

RECORDS = Path(__file__).parent / "records"
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json")  # as JSONDatabase writes them
FILES = tuple(f"{name}.xz" for name in DATABASE_FILES)  # as shipped


def records_dir(chip: str) -> Path:
    """The folder of ``chip``'s shipped records (a preset name, e.g. ``stcp920``)."""
    return RECORDS / chip


class ShippedRecords:
    """A compressed database (``FILES``) parsed a workload at a time. Each workload line begins
    with its structural hash, so a lookup parses only the lines (and their records) with the
    hash of the module asked for; parsing all of stcp920's 321 took 1.7 s of the first DSA
    compile in a process, while a model looks up a dozen. Answers the database calls the
    pipeline, ``tuned_kernel`` and ``merge_records`` make from what has been parsed."""

    def __init__(self, folder: str | os.PathLike):
        workload_file, record_file = (Path(folder, f) for f in FILES)
        with lzma.open(workload_file, "rt") as f:
            self._lines = [line for line in f if line.strip()]
        self._unread: dict[int, list[int]] = {}  # structural hash -> lines not parsed yet
        for i, line in enumerate(self._lines):
            self._unread.setdefault(int(json.loads(line[:line.index(",")] + "]")[0]), []).append(i)
        self._records: dict[int, list] = {}  # workload line -> its records (JSON)
        with lzma.open(record_file, "rt") as f:
            for line in f:
                if line.strip():
                    index, record = json.loads(line)
                    self._records.setdefault(index, []).append(record)
        self._database = ms.database.MemoryDatabase(module_equality="structural")

    def _parse(self, lines) -> None:
        for i in lines:
            workload = self._database.commit_workload(ms.database.Workload.from_json(json.loads(self._lines[i])).mod)
            for record in self._records.get(i, ()):
                self._database.commit_tuning_record(ms.database.TuningRecord.from_json(record, workload))

    def _read(self, mod) -> None:
        self._parse(self._unread.pop(tvm_ffi.structural_hash(mod), ()))

    def has_workload(self, mod) -> bool:
        self._read(mod)
        return self._database.has_workload(mod)

    def commit_workload(self, mod):
        self._read(mod)
        return self._database.commit_workload(mod)

    def get_top_k(self, workload, top_k: int) -> list:
        return self._database.get_top_k(workload, top_k)

    def get_all_tuning_records(self) -> list:
        for lines in self._unread.values():
            self._parse(lines)
        self._unread.clear()
        return self._database.get_all_tuning_records()


def read_records(folder: str | os.PathLike) -> ShippedRecords:
    """The compressed database in ``folder`` (``FILES``)."""
    return ShippedRecords(folder)


@functools.lru_cache(maxsize=None)
def pretuned(chip: str) -> ShippedRecords | None:
    """The shipped database of ``chip``, or None when the package has no records for it. Read
    once per process (the package folder is never written)."""
    folder = records_dir(chip)
    if not all((folder / f).is_file() for f in FILES):
        return None
    return read_records(folder)


def merge_records(sources, chip: str, folder: str | os.PathLike | None = None) -> int:
    """Write the fastest record of every workload found in ``sources`` (databases, work_dirs of
    ``tvm_dsa.tune`` or folders of shipped records; records of other chips skipped) as the
    compressed database in ``folder`` (default: ``chip``'s shipped records), replacing what was
    there. Give the current records among the sources to keep them. Returns the number of
    workloads written.

    A record's stored time may be stale (tuned under an older kernel generation), so a
    workload's records are re-measured now, fastest stored time first: the first whose program is
    not slower than the default tiling's is written with its new time; a workload none of whose
    records does as well as the default gets none (the default applies)."""
    from tvm_dsa.tuning import default_seconds, load_database, replayed_seconds

    hw = hardware.get(chip)
    candidates: dict = {}  # structural hash of the workload -> its records
    for source in sources:
        if isinstance(source, (str, os.PathLike)):
            shipped = all(Path(source, f).is_file() for f in FILES)
            database = read_records(source) if shipped else load_database(source)
        else:
            database = source
        for record in database.get_all_tuning_records():
            if record.target is None or str(record.target.attrs.get("model")) != chip or not record.run_secs:
                continue
            candidates.setdefault(tvm_ffi.structural_hash(record.workload.mod), []).append(record)
    best = []  # (record, its time now)
    for records in candidates.values():
        default = default_seconds(records[0].workload.mod["main"], hw)
        for record in sorted(records, key=lambda r: float(r.run_secs[0])):
            try:
                seconds = replayed_seconds(record, hw)
            except Unsupported:
                continue
            if seconds <= default:
                best.append((record, seconds))
                break
    folder = Path(folder) if folder is not None else records_dir(chip)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        out = load_database(tmp)
        for record, seconds in best:
            workload = out.commit_workload(record.workload.mod)
            out.commit_tuning_record(ms.database.TuningRecord(record.trace, workload, [seconds],
                                                              record.target, record.args_info))
        for name, packed in zip(DATABASE_FILES, FILES):
            with open(Path(tmp, name), "rb") as src, lzma.open(Path(tmp, packed), "wb", preset=9) as dst:
                shutil.copyfileobj(src, dst)
            os.replace(Path(tmp, packed), folder / packed)
    pretuned.cache_clear()
    return len(best)
