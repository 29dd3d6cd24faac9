"""What a user looks at: tables for the CLI, plots of simulated runs (per-unit Gantt, roofline)."""

from .table import render_table

__all__ = ["render_table"]
