"""What a user looks at: tables for the CLI, plots of simulated runs (per-unit Gantt, roofline)."""

from tvm_dsa.show.table import render_table

__all__ = ["render_table"]
