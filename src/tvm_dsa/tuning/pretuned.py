"""Pre-tuned records shipped with the package (seed 004's TopHub): one JSON database per chip
preset under ``tuning/records/<preset>/``, holding the best record of each benchmark kernel tuned
on it. The ``dsa`` pipeline consults them when no database is given (``pipeline(database=False)``
turns them off); ``benchmarks/pretune.py`` fills them with ``merge_records``.
"""

from __future__ import annotations

import functools
import os
import tempfile
from pathlib import Path

import tvm_ffi
from tvm.s_tir import meta_schedule as ms

RECORDS = Path(__file__).parent / "records"
FILES = ("database_workload.json", "database_tuning_record.json")


def records_dir(chip: str) -> Path:
    """The folder of ``chip``'s shipped records (a preset name, e.g. ``stcp920``)."""
    return RECORDS / chip


@functools.lru_cache(maxsize=None)
def pretuned(chip: str) -> ms.database.JSONDatabase | None:
    """The shipped database of ``chip``, or None when the package has no records for it. Loaded
    once per process; never written (the package folder may be read-only)."""
    folder = records_dir(chip)
    if not all((folder / f).is_file() for f in FILES):
        return None
    return ms.database.JSONDatabase(*(str(folder / f) for f in FILES), allow_missing=False,
                                    module_equality="structural")


def merge_records(sources, chip: str, folder: str | os.PathLike | None = None) -> int:
    """Write the fastest record of every workload found in ``sources`` (databases or work_dirs of
    ``tvm_dsa.tune``; records of other chips skipped) as the database in ``folder`` (default:
    ``chip``'s shipped records), replacing what was there. Give the current records among the
    sources to keep them. Returns the number of workloads written."""
    from . import load_database

    best: dict = {}  # structural hash of the workload -> record
    for source in sources:
        database = load_database(source) if isinstance(source, (str, os.PathLike)) else source
        for record in database.get_all_tuning_records():
            if record.target is None or str(record.target.attrs.get("model")) != chip or not record.run_secs:
                continue
            key = tvm_ffi.structural_hash(record.workload.mod)
            if key not in best or float(record.run_secs[0]) < float(best[key].run_secs[0]):
                best[key] = record
    folder = Path(folder) if folder is not None else records_dir(chip)
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as tmp:
        out = load_database(tmp)
        for record in best.values():
            workload = out.commit_workload(record.workload.mod)
            out.commit_tuning_record(ms.database.TuningRecord(record.trace, workload, record.run_secs,
                                                              record.target, record.args_info))
        for name in FILES:
            os.replace(Path(tmp, name), folder / name)
    pretuned.cache_clear()
    return len(best)
