"""Auto-mapping (HybridFlow paper section 6): where each model of the dataflow runs and with
which parallel sizes, chosen by a calibrated cost simulator.

    from hybridflow.planner import Cluster, plan
    mappings = plan(run_config, Cluster.of(nodes=16, devices_per_node=8, device="a100-80gb"))
"""

from __future__ import annotations

from hybridflow.config.schema import RunConfig
from hybridflow.planner.cost import Parallel
from hybridflow.planner.model import LLAMA, ModelShape
from hybridflow.planner.problem import Capabilities, Cluster, Problem, problem_from_config
from hybridflow.planner.search import PlanResult, search
from hybridflow.planner.simulate import Infeasible, Mapping, Pool, simulate

__all__ = ["Capabilities", "Cluster", "Infeasible", "LLAMA", "Mapping", "ModelShape", "Parallel", "PlanResult",
           "Pool", "Problem", "plan", "problem_from_config", "search", "simulate"]


def plan(config: RunConfig, cluster: Cluster, *, top: int = 5, caps: Capabilities | None = None,
         model: ModelShape | None = None) -> list[Mapping]:
    """The best `top` mappings of `config`'s dataflow on `cluster`, fastest first.

    caps: what the runtime can run (default: the paper's runtime, every placement,
    overlapping pools; `Capabilities.for_run(config)` for this trainer). model: replace
    every role's model with this shape (e.g. LLAMA["llama-70b"]).
    """
    return search(problem_from_config(config, cluster, caps, model), top).mappings
