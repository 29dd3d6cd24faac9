"""Where a core's MME waits under graphturbo (docs/graphturbo.md): per unit, its busy time; the
MME's idle time between its instructions, by what the core does meanwhile.

    python benchmarks/idle.py --models bert-128 --batch 8
    python benchmarks/idle.py --models bert-128 vit_b16 --core 3
    python benchmarks/idle.py --tiny                     # a quick check of the script

Each workload is compiled as ``relax_pipeline="dsa"`` compiles it and run once in timing mode with
a trace. A gap between two MME instructions of the core is counted under

- ``loads``: the two belong to one layer and no vector instruction of the core starts between
  them (the chunk's loads, or a tile's stores and the next tile's loads, took longer than the
  product);
- ``epilogue``: one layer, with vector work between (a tile's epilogue before the next tile);
- ``layer change``: the next MME belongs to another layer (a vector-only layer between, waiting
  for other cores' outputs or a weight's promotion);

and the time before the core's first MME and after its last as ``outside``.
"""

from __future__ import annotations

from graphturbo import ENDS, _step, _table, run_variants, workload_parser

UNITS = ("dma", "mme", "vme", "vec")
KINDS = ("loads", "epilogue", "layer change", "outside")


def idle(events, core: int) -> tuple[float, dict, dict]:
    """(span, busy µs per unit, MME idle µs per kind) of ``core`` in a trace's events."""
    mine = sorted((e for e in events if e.get("ph") == "X" and e["pid"] == core), key=lambda e: e["ts"])
    start, end = mine[0]["ts"], max(e["ts"] + e["dur"] for e in mine)
    busy = dict.fromkeys(UNITS, 0.0)
    for e in mine:
        busy[e["cat"]] = busy.get(e["cat"], 0.0) + e["dur"]
    mme = [e for e in mine if e["cat"] == "mme"]
    vector = [e["ts"] for e in mine if e["cat"] in ("vme", "vec")]
    gaps = dict.fromkeys(KINDS, 0.0)
    if not mme:
        gaps["outside"] = end - start
        return end - start, busy, gaps
    gaps["outside"] = mme[0]["ts"] - start + end - (mme[-1]["ts"] + mme[-1]["dur"])
    v = 0
    for a, b in zip(mme, mme[1:]):
        lo = a["ts"] + a["dur"]
        while v < len(vector) and vector[v] < lo:
            v += 1
        if a["args"]["layer"] != b["args"]["layer"]:
            kind = "layer change"
        else:
            kind = "epilogue" if v < len(vector) and vector[v] < b["ts"] else "loads"
        gaps[kind] += max(0.0, b["ts"] - lo)
    return end - start, busy, gaps


def main() -> None:
    p = workload_parser(__doc__, ["bert-128"])
    p.add_argument("--core", type=int, default=0)
    args = p.parse_args()
    best = ENDS[-1]
    rows = []
    for label in args.models:
        run = run_variants(label, args.batch, args.tiny, args.target, False, [best], traced=(best[0],))[best[0]][1]
        _step(f"{label}: reading the trace")
        span, busy, gaps = idle(run.trace, args.core)
        rows.append([label, f"{span:,.1f}", *(f"{100 * busy[u] / span:.1f}%" for u in UNITS),
                     *(f"{gaps[k]:,.1f} ({100 * gaps[k] / span:.1f}%)" for k in KINDS)])
    _table(f"Core {args.core} under graphturbo on {args.target}, batch {args.batch}"
           f"{' (tiny)' if args.tiny else ''}: busy share per unit; MME idle µs (share of the span)",
           ["model", "span µs", *(f"{u} busy" for u in UNITS), *(f"idle: {k}" for k in KINDS)], rows)


if __name__ == "__main__":
    main()
