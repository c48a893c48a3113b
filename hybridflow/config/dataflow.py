"""The dataflow of an RL step program: which phases it runs, on which role, in which stage.

One description per algorithm lives on its registry row (`AlgorithmSpec.dataflow`); the
auto-mapping planner (hybridflow/planner) reads it to cost a step, and
tests/planner/test_dataflow.py runs every built-in program with recording phases to check
that the description (phases and blocks) and the program say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("generate", "forward", "train", "controller")
CONDITIONS = ("always", "reward_model", "cost_model", "reference", "old_log_probs", "rule_reward", "rule_cost")
BLOCK_KINDS = ("forward", "train")  # the kinds a `concurrently` block can hold
_STAGE = {"generate": 0, "forward": 1, "controller": 1, "train": 2}


@dataclass(frozen=True)
class FlowPhase:
    """One phase of the step on one role (module docstring)."""

    name: str
    role: str
    kind: str
    when: str = "always"
    samples_per_prompt: int | None = None
    block: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"FlowPhase {self.name!r}: kind must be one of {KINDS}, got {self.kind!r}")
        if self.block is not None and self.kind not in BLOCK_KINDS:
            # Only worker-group calls are deferred by a block; generation replaces the batch
            # (refused inside one) and controller work runs where the program calls it.
            raise ValueError(f"FlowPhase {self.name!r}: a {self.kind} phase cannot be in a concurrently block "
                             f"(block={self.block!r}); only {BLOCK_KINDS} phases can, or set block=None")
        if self.when not in CONDITIONS:
            raise ValueError(f"FlowPhase {self.name!r}: when must be one of {CONDITIONS}, got {self.when!r}")

    @property
    def stage(self) -> int:
        return _STAGE[self.kind]


def standard_dataflow(critics: tuple[str, ...], cost: bool,
                      extra_scoring: tuple[FlowPhase, ...] = ()) -> tuple[FlowPhase, ...]:
    """The phases of the generate -> score -> log-probs -> values -> update programs, in the
    order the programs call them: the rule reward and/or reward model, the cost model
    (`cost`), `extra_scoring` (e.g. ReMax's greedy baseline), old and reference log-probs,
    one value pass and one update per critic, the actor update. Their blocks, as the
    built-in programs open them (trainer/programs/algorithms.py): the log-probs and the
    critics' values in one ("scoring"), the critics' updates with the actor's ("updates",
    only with critics: a critic-free program updates the actor on its own)."""
    phases = [
        FlowPhase("gen", "actor", "generate"),
        FlowPhase("reward", "controller", "controller", when="rule_reward"),
        FlowPhase("reward", "reward_model", "forward", when="reward_model"),
    ]
    if cost:
        phases += [FlowPhase("cost", "controller", "controller", when="rule_cost"),
                   FlowPhase("cost", "cost_model", "forward", when="cost_model")]
    updates = "updates" if critics else None
    phases += [*extra_scoring,
               FlowPhase("old_log_prob", "actor", "forward", when="old_log_probs", block="scoring"),
               FlowPhase("ref", "reference", "forward", when="reference", block="scoring")]
    phases += [FlowPhase(_VALUE_PHASE[c], c, "forward", block="scoring") for c in critics]
    phases += [FlowPhase(f"update_{c}", c, "train", block=updates) for c in critics]
    phases.append(FlowPhase("update_actor", "actor", "train", block=updates))
    return tuple(phases)


# The value pass of each critic role (phase names of hybridflow/trainer/programs/phases.py).
_VALUE_PHASE = {"critic": "values", "cost_critic": "cost_values"}
