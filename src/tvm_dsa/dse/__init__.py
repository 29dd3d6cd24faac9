"""Design-space exploration (docs/dse.md): sweeps of chips derived from a base chip, and of the
compiler's choices, over models, each trial compiled and simulated in timing mode, in this process
or as Ray tasks; resumable through a journal, deterministic for a seed.

    space = load_space("examples/space-stcp920.toml")
    config = SweepConfig(("resnet18",), tiny=True, batch=None, space=space)
    results = sweep(config, InProcess(), Journal("sweep.journal.jsonl"), progress=lambda status: None)
"""

from tvm_dsa.dse.engine import InProcess, OnRay, ray_available, ray_engine
from tvm_dsa.dse.space import Axis, Space, load_space, parse_space
from tvm_dsa.dse.sweep import SEARCHES, Journal, Status, SweepConfig, sweep
from tvm_dsa.dse.trial import OBJECTIVES, TrialResult, TrialSpec, run_trial

__all__ = ["OBJECTIVES", "SEARCHES", "Axis", "InProcess", "Journal", "OnRay", "Space", "Status", "SweepConfig",
           "TrialResult", "TrialSpec", "load_space", "parse_space", "ray_available", "ray_engine", "run_trial",
           "sweep"]
