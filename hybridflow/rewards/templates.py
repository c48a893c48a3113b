"""Reward templates: named scoring rules, composed with weights in the config.

    reward:
      templates:
        - {name: numeric_match, weight: 1.0, args: {rel_tol: 1.0e-6}}
        - {name: regex, weight: 0.1, args: {pattern: '^\\d+$'}}
        - {name: tool_penalty, weight: 1.0, args: {per_call: 0.05}}
        - {name: regex, level: turn, weight: 0.1, args: {pattern: '@calculator\\['}}   # per model turn
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hybridflow.errors import ConfigError
from hybridflow.registry import Registry
from hybridflow.rewards.registry import SCORERS, DispatchScore, FileRewardFn


@dataclass(frozen=True)
class Sample:
    """What a template reads: the text (final turn, or one turn), the row, and the episode."""

    text: str
    ground_truth: Any
    data_source: str
    extra_info: dict
    num_turns: int = 1
    num_tool_calls: int = 0
    num_tokens: int = 0  # model tokens of the whole response


Template = Callable[..., float]
_TEMPLATES: Registry[Template] = Registry("reward template")


def register_reward_template(name: str, *, override: bool = False) -> Callable[[Template], Template]:
    """``@register_reward_template("name")`` on a `fn(sample: Sample, **args) -> float`
    (another definition under a taken name needs override=True)."""
    return _TEMPLATES.register(name, override=override)


def reward_templates() -> list[str]:
    return _TEMPLATES.names()


MODEL_TEMPLATE = "reward_model"


@register_reward_template(MODEL_TEMPLATE)
def reward_model(s: Sample) -> float:
    """Placeholder of the learned reward model's score: the trainer adds it from the
    reward-model worker group (module docstring); it has no text-only value."""
    raise TypeError("the reward_model template is scored by the reward-model worker group (reward_model.path), "
                    "not on text; ComposedScore skips it")


def model_weight(items: list[dict]) -> float | None:
    """The weight of the `reward_model` entry of a (validated) `reward.templates` list, or
    None when the list does not name it."""
    return next((float(i.get("weight", 1.0)) for i in items if i["name"] == MODEL_TEMPLATE), None)


_NUMBER = re.compile(r"-?\d[\d,]*\.?\d*(?:[eE][-+]?\d+)?")


@register_reward_template("exact_match")
def exact_match(s: Sample, case_sensitive: bool = True) -> float:
    a, b = s.text.strip(), str(s.ground_truth).strip()
    return float(a == b if case_sensitive else a.lower() == b.lower())


@register_reward_template("numeric_match")
def numeric_match(s: Sample, abs_tol: float = 0.0, rel_tol: float = 1e-9) -> float:
    found = _NUMBER.findall(s.text)
    if not found:
        return 0.0
    try:
        got, want = float(found[-1].replace(",", "")), float(str(s.ground_truth).replace(",", ""))
    except ValueError:
        return 0.0
    return float(math.isclose(got, want, rel_tol=rel_tol, abs_tol=abs_tol))


@register_reward_template("regex")
def regex(s: Sample, pattern: str, fullmatch: bool = False) -> float:
    return float(bool(re.fullmatch(pattern, s.text.strip()) if fullmatch else re.search(pattern, s.text)))


@register_reward_template("length_penalty")
def length_penalty(s: Sample, target: int, per_token: float) -> float:
    """-per_token for every model token beyond `target`."""
    return -per_token * max(0, s.num_tokens - target)


@register_reward_template("turn_penalty")
def turn_penalty(s: Sample, per_turn: float, free_turns: int = 1) -> float:
    return -per_turn * max(0, s.num_turns - free_turns)


@register_reward_template("tool_penalty")
def tool_penalty(s: Sample, per_call: float, free_calls: int = 0) -> float:
    return -per_call * max(0, s.num_tool_calls - free_calls)


@register_reward_template("rule")
def rule(s: Sample) -> float:
    """The built-in scorer of the sample's data_source (registry.py)."""
    return _as_float(DispatchScore()(s.data_source, s.text, s.ground_truth, s.extra_info))


# runs_user_code: a file's code, which runs only in the confined reward workers (never on the
# controller, where turn-level templates are scored)
@_TEMPLATES.register("user", runs_user_code=True)
def user(s: Sample, path: str, name: str = "compute_score") -> float:
    return _as_float(FileRewardFn(path, name)(data_source=s.data_source, solution_str=s.text,
                                              ground_truth=s.ground_truth, extra_info=s.extra_info))


@dataclass(frozen=True)
class ScorerTemplate:
    """A data source's rule scorer as a template (picklable: it travels to the reward pool)."""

    source: str

    def __call__(self, s: Sample) -> float:
        return _as_float(SCORERS[self.source](s.text, s.ground_truth, s.extra_info))


for _source in ("arithmetic", "gsm8k", "math"):  # the rule scorers, as templates of this engine
    _TEMPLATES.add(_source, ScorerTemplate(_source))


def _as_float(value: Any) -> float:
    return float(value["score"] if isinstance(value, dict) else value)


@dataclass(frozen=True)
class TemplateSpec:
    name: str
    weight: float = 1.0
    level: str = "trajectory"  # or "turn"
    args: dict = field(default_factory=dict)
    # the template function itself: it travels (pickled by reference) to the reward pool's
    # fresh processes, which import its module and so know templates registered there
    fn: Template = field(default=None, compare=False, repr=False)


def parse_templates(items: list[dict], key: str = "reward.templates") -> list[TemplateSpec]:
    """Config entries -> specs, with ConfigErrors keyed by the entry."""
    specs = []
    for i, item in enumerate(items):
        where = f"{key}[{i}]"
        if not isinstance(item, dict) or "name" not in item:
            raise ConfigError(f"each template is a mapping with a name, got {item!r}", where)
        unknown = set(item) - {"name", "weight", "level", "args"}
        if unknown:
            raise ConfigError(f"unknown keys {sorted(unknown)}; a template takes name, weight, level, args", where)
        fn = _TEMPLATES.resolve(item["name"], where + ".name", "register one with @register_reward_template in "
                                "a module and name it 'package.module:name' (importing it registers it)")
        spec = TemplateSpec(item["name"], float(item.get("weight", 1.0)), item.get("level", "trajectory"),
                            dict(item.get("args") or {}), fn)
        if spec.level not in ("trajectory", "turn"):
            raise ConfigError(f"must be 'trajectory' or 'turn', got {spec.level!r}", where + ".level")
        if spec.name == MODEL_TEMPLATE:
            _check_model_spec(spec, specs, where)
            specs.append(spec)
            continue
        if spec.level == "turn" and _TEMPLATES.capabilities(spec.name).get("runs_user_code"):
            raise ConfigError(f"template {spec.name!r} runs a file's code, which runs only in the confined reward "
                              "workers; turn-level templates are scored on the controller: use it at level "
                              "trajectory", where + ".level")
        try:  # arguments checked now against the signature (nothing is called), so a typo fails at start-up
            inspect.signature(spec.fn).bind(Sample("", "0", "arithmetic", {}), **spec.args)
        except TypeError as err:
            raise ConfigError(f"bad args for template {spec.name!r}: {err}", where + ".args") from None
        except ValueError:
            pass  # a callable without an inspectable signature
        specs.append(spec)
    return specs


def _check_model_spec(spec: TemplateSpec, earlier: list[TemplateSpec], where: str) -> None:
    if spec.level != "trajectory":
        raise ConfigError("the reward model scores whole sequences: level must be 'trajectory'", where + ".level")
    if spec.args:
        raise ConfigError(f"takes no args (the model is reward_model.path), got {spec.args}", where + ".args")
    if any(s.name == MODEL_TEMPLATE for s in earlier):
        raise ConfigError("reward_model is named twice; give it once with the summed weight", where + ".name")


class ComposedScore:
    """The weighted sum of trajectory-level templates, with reward-function signature
    (`reward_model` excluded: the trainer adds it from the reward-model workers)."""

    def __init__(self, specs: list[TemplateSpec]) -> None:
        self.specs = [s for s in specs if s.level == "trajectory" and s.name != MODEL_TEMPLATE]

    def __call__(self, data_source: str, solution_str: str, ground_truth: Any, extra_info: dict | None = None):
        info = dict(extra_info or {})
        sample = Sample(solution_str, ground_truth, data_source, info, int(info.get("num_turns", 1)),
                        int(info.get("num_tool_calls", 0)), int(info.get("num_model_tokens", 0)))
        parts = {s.name: s.weight * s.fn(sample, **s.args) for s in self.specs}
        return {"score": sum(parts.values()), **{f"template/{k}": v for k, v in parts.items()}}


def score_turns(specs: list[TemplateSpec], turn_texts: list[str], row: dict) -> list[float]:
    """Weighted sum of the turn-level templates for each turn's text."""
    turn_specs = [s for s in specs if s.level == "turn"]
    out = []
    for i, text in enumerate(turn_texts):
        sample = Sample(text, row.get("ground_truth"), str(row.get("data_source")), dict(row.get("extra_info") or {}),
                        num_turns=i + 1)
        out.append(sum(s.weight * s.fn(sample, **s.args) for s in turn_specs))
    return out
