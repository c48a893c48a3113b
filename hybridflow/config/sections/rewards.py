"""The `reward`, `reward_model` and `cost_model` sections: rule-based rewards and learned scorers."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.engines.train.config import EngineSettings
from hybridflow.errors import ConfigError
from hybridflow.rewards.config import RewardConfig
from hybridflow.rewards.registry import reward_fn_reference


@dataclass
class RewardSection:
    """Rule-based rewards scored in worker processes (errors and hangs are contained).

    custom_fn_path / custom_fn_name: your reward function in a Python file or an importable
        module (dotted name): verl's `compute_score(data_source, solution_str, ground_truth,
        extra_info)`, a scorer's `compute_score(solution_str, ground_truth)` or TRL's batched
        `reward(completions, **kwargs)` (hybridflow/rewards/shapes.py); null uses the built-in
        scorers. From Python, custom_fn_path may be the function itself: it is recorded by its
        import path (see `reward_reference`). A list of names: their weighted sum
        (custom_fn_weights; null: 1 each), as TRL sums its reward_funcs.
    """

    manager: RewardConfig = field(default_factory=lambda: RewardConfig(num_workers=1, timeout_s=10.0))
    custom_fn_path: str | Callable[..., float] | None = None  # a function: turned into its path
    custom_fn_name: str | list[str] = "compute_score"
    custom_fn_weights: list[float] | None = None
    # reward templates composed with weights (rewards/templates.py, docs/agents.md); empty:
    # the data source's scorer (or custom_fn). Entries: {name, weight, level, args}.
    templates: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        from hybridflow.rewards.templates import parse_templates

        self.custom_fn_path, self.custom_fn_name = reward_reference(self.custom_fn_path, self.custom_fn_name)
        parse_templates(self.templates, "templates")
        names = self.custom_fn_name if isinstance(self.custom_fn_name, list) else [self.custom_fn_name]
        if not names or self.custom_fn_weights is not None and len(self.custom_fn_weights) != len(names):
            raise ConfigError(f"{self.custom_fn_weights} for the {len(names)} functions of custom_fn_name {names}: "
                              "give one weight per function (null: 1 each)", "custom_fn_weights")
        if self.templates and self.custom_fn_path is not None:
            raise ConfigError("give either templates or custom_fn_path; a file function is the template "
                              "{name: user, args: {path: ..., name: ...}}", "templates")


def reward_reference(path: Any, name: str) -> tuple[str | None, str]:
    """(custom_fn_path, custom_fn_name) with a Python function given as the path replaced by
    its import path (rewards.registry.reward_fn_reference), so the config saves as YAML."""
    if not callable(path):
        return path, name
    try:
        return reward_fn_reference(path)
    except ValueError as err:
        raise ConfigError(str(err), "custom_fn_path") from None


@dataclass
class ScoreModelSection(EngineSettings):
    """A frozen sequence scorer: a Hugging Face `*ForSequenceClassification` directory with
    num_labels=1 (what `hybridflow rm` writes) that shares the policy's tokenizer, run on the
    actor's ranks. path null: none. The keys of a frozen engine (EngineSettings: no optimizer,
    no LoRA, micro_batch holds only the scoring keys: ForwardBatchConfig)."""

    path: str | None = None


@dataclass
class RewardModelSection(ScoreModelSection):
    """A learned reward model (any algorithm): its score, put on the last response token, is
    the reward instead of the rule-based one; add_rule_reward: true sums the two."""

    add_rule_reward: bool = False


@dataclass
class CostModelSection(ScoreModelSection):
    """The cost of algorithm.name=safe_rlhf: a cost model (path) and/or a rule-based cost
    function `custom_fn_name(data_source, solution_str, ground_truth, extra_info)` in the Python
    file custom_fn_path, scored like reward functions (reward.manager settings); both: summed."""

    custom_fn_path: str | Callable[..., float] | None = None  # a function: turned into its path
    custom_fn_name: str = "compute_score"

    def __post_init__(self) -> None:
        super().__post_init__()
        self.custom_fn_path, self.custom_fn_name = reward_reference(self.custom_fn_path, self.custom_fn_name)
