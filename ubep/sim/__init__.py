"""Superpod simulator: a discrete-event model (SimPy) of one MoE dispatch on many ranks.

``model`` simulates one dispatch (BSP or decomposed; any scheduler mapping; any sync mode),
``params`` holds the hardware and software costs, ``scenarios`` sets up the UBEP paper's experiments,
``report`` writes their tables and figures. ``ubep simulate --scenario paper-fig10`` runs one.
"""

from ubep.sim.model import RankResult, Routing, SimConfig, simulate
from ubep.sim.params import SimParams
from ubep.sim.scenarios import SCENARIOS, run_scenario

__all__ = ["SCENARIOS", "RankResult", "Routing", "SimConfig", "SimParams", "run_scenario", "simulate"]
