"""Reward templates (rewards/templates.py) and their composition in the RewardManager.

Each built-in template on hand-made samples; the rule scorers as templates equal the
data-source scorers; weighted composition with per-component extras; config errors; and a
multi-turn batch through the manager: the final turn is scored, tool and turn penalties
read the episode, turn-level templates land on each turn's last token, environment turn
rewards are added, and a failed environment's error score replaces the scorer's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from hybridflow.data.tokenizer import build_char_tokenizer
from hybridflow.errors import ConfigError
from hybridflow.protocol import DataProto
from hybridflow.rewards import RewardManager
from hybridflow.rewards.manager import RewardConfig, turn_spans
from hybridflow.rewards.registry import default_compute_score
from hybridflow.rewards.templates import ComposedScore, Sample, parse_templates, reward_templates
from hybridflow.rewards import templates as T


def _s(text, truth="42", **kw):
    return Sample(text, truth, kw.pop("data_source", "arithmetic"), {}, **kw)


def test_builtin_templates():
    assert T.exact_match(_s(" 42 ")) == 1.0 and T.exact_match(_s("Yes", "yes"), case_sensitive=False) == 1.0
    assert T.numeric_match(_s("so the answer is 41.9999999", "42"), rel_tol=1e-6) == 1.0
    assert T.numeric_match(_s("1,234 apples", "1234")) == 1.0 and T.numeric_match(_s("none")) == 0.0
    assert T.numeric_match(_s("42.5"), abs_tol=0.1) == 0.0
    assert T.regex(_s("@calculator[1+2]"), pattern=r"@calculator\[") == 1.0
    assert T.regex(_s("12a"), pattern=r"\d+", fullmatch=True) == 0.0
    assert T.length_penalty(_s("", num_tokens=30), target=20, per_token=0.01) == pytest.approx(-0.1)
    assert T.turn_penalty(_s("", num_turns=3), per_turn=0.1) == pytest.approx(-0.2)
    assert T.tool_penalty(_s("", num_tool_calls=3), per_call=0.05, free_calls=1) == pytest.approx(-0.1)


@pytest.mark.parametrize("source,text,truth", [("arithmetic", "357", "357"), ("arithmetic", "356", "357"),
                                               ("gsm8k", "so #### 72", "72"), ("math", "\\boxed{3}", "3")])
def test_rule_scorers_are_templates(source, text, truth):
    want = default_compute_score(source, text, truth)
    want = want["score"] if isinstance(want, dict) else want
    assert getattr(T, "rule")(Sample(text, truth, source, {})) == want
    assert ComposedScore(parse_templates([{"name": source}]))(source, text, truth)["score"] == want


def test_composition_weights_and_extras():
    fn = ComposedScore(parse_templates([{"name": "numeric_match", "weight": 2.0},
                                        {"name": "tool_penalty", "args": {"per_call": 0.1}},
                                        {"name": "regex", "level": "turn", "args": {"pattern": "x"}}]))
    out = fn("arithmetic", "answer 42", "42", {"num_tool_calls": 3})
    assert out["score"] == pytest.approx(2.0 - 0.3)
    assert out["template/numeric_match"] == 2.0 and out["template/tool_penalty"] == pytest.approx(-0.3)
    assert "template/regex" not in out  # turn-level: scored per turn by the manager


def test_config_errors():
    with pytest.raises(ConfigError, match="unknown reward template"):
        parse_templates([{"name": "exactmatch"}])
    with pytest.raises(ConfigError, match="bad args"):
        parse_templates([{"name": "regex", "args": {"patern": "x"}}])
    with pytest.raises(ConfigError, match="level"):
        parse_templates([{"name": "regex", "level": "step", "args": {"pattern": "x"}}])
    with pytest.raises(ConfigError, match="unknown keys"):
        parse_templates([{"name": "exact_match", "wieght": 1}])
    assert {"exact_match", "numeric_match", "regex", "length_penalty", "turn_penalty", "tool_penalty", "rule",
            "user", "arithmetic", "gsm8k", "math"} <= set(reward_templates())


def test_reward_model_template_config(tmp_path):
    """reward_model: a weighted template the trainer fills from reward_model.path; skipped by
    the text composition; trajectory level only, no args, once; needs the model and no
    add_rule_reward (the templates list is the whole composition)."""
    from hybridflow.config.schema import load_run_config
    from hybridflow.trainer.programs.phases import _env_kept

    specs = parse_templates([{"name": "reward_model", "weight": 0.5}, {"name": "numeric_match"}])
    assert T.model_weight([{"name": "reward_model", "weight": 0.5}]) == 0.5
    assert T.model_weight([{"name": "numeric_match"}]) is None
    assert ComposedScore(specs)("arithmetic", "42", "42") == {"score": 1.0, "template/numeric_match": 1.0}
    with pytest.raises(ConfigError, match="level must be 'trajectory'"):
        parse_templates([{"name": "reward_model", "level": "turn"}])
    with pytest.raises(ConfigError, match="takes no args"):
        parse_templates([{"name": "reward_model", "args": {"path": "x"}}])
    with pytest.raises(ConfigError, match="named twice"):
        parse_templates([{"name": "reward_model"}, {"name": "reward_model"}])
    with pytest.raises(TypeError, match="reward-model worker group"):
        T.reward_model(_s("42"))
    templates = "reward.templates=[{name: reward_model, weight: 0.5}]"
    with pytest.raises(ConfigError, match="reward_model.path is null") as err:
        load_run_config(None, [templates])
    assert err.value.key == "reward.templates"
    rm = tmp_path / "rm"
    with pytest.raises(ConfigError, match="must stay false") as err:
        load_run_config(None, [templates, f"reward_model.path={rm}", "reward_model.add_rule_reward=true"])
    assert err.value.key == "reward_model.add_rule_reward"
    # a failed environment's row (score_override set) gets no model score
    batch = DataProto.from_dict(tensors={"x": torch.zeros(3, 1)},
                                non_tensors={"score_override": np.array([math.nan, -1.0, math.nan], dtype=object)})
    assert _env_kept(batch).tolist() == [1.0, 0.0, 1.0]


def test_turn_spans():
    assert turn_spans(torch.tensor([1, 1, 0, 0, 1, 0, 1, 1, 1, 0])) == [(0, 2), (4, 5), (6, 9)]


def _multi_turn_batch(tok):
    """Two trajectories: model turn, observation, model turn (the final answer)."""
    rows = [("@calculator[6*7]</s>", "<|user|>42<|assistant|>", "42</s>"),
            ("@calculator[1+1]</s>", "<|user|>2<|assistant|>", "41</s>")]
    width = 40
    responses = torch.zeros(2, width, dtype=torch.long)
    mask = torch.zeros(2, width, dtype=torch.long)
    starts = []
    for i, parts in enumerate(rows):
        pos = 0
        for j, part in enumerate(parts):
            ids = tok(part, add_special_tokens=False)["input_ids"]
            responses[i, pos: pos + len(ids)] = torch.tensor(ids)
            mask[i, pos: pos + len(ids)] = 0 if j == 1 else 1
            if j == 2:
                starts.append(pos)
            pos += len(ids)
    env_rewards = torch.zeros(2, width)
    env_rewards[0, len(tok(rows[0][0], add_special_tokens=False)["input_ids"]) - 1] = 0.25  # end of turn 1
    obj = lambda xs: np.array(xs, dtype=object)  # noqa: E731
    return DataProto.from_dict(
        tensors={"responses": responses, "response_mask": mask, "env_rewards": env_rewards},
        non_tensors={"data_source": obj(["arithmetic"] * 2), "ground_truth": obj(["42", "2"]),
                     "extra_info": obj([{}, {}]), "final_turn_start": obj(starts), "num_turns": obj([2, 2]),
                     "num_tool_calls": obj([1, 1]), "score_override": obj([math.nan, -1.0]),
                     "agent_stop": obj(["done", "env_error"])})


def test_manager_composes_templates_on_multi_turn_batch():
    tok = build_char_tokenizer()
    specs = parse_templates([{"name": "exact_match"}, {"name": "tool_penalty", "args": {"per_call": 0.1}},
                             {"name": "regex", "level": "turn", "weight": 0.5, "args": {"pattern": r"@calculator\["}}])
    batch = _multi_turn_batch(tok)
    with RewardManager(tok, RewardConfig(num_workers=0), compute_score=ComposedScore(specs),
                       turn_templates=specs) as manager:
        out = manager.score(batch)
    mask = batch.batch["response_mask"]
    spans0 = turn_spans(mask[0])
    # row 0: final turn "42" exact (1.0) - 0.1 tool call, on its last token; turn 1 made a call (+0.5);
    # the env's 0.25 turn reward stays where the loop put it
    assert out.scores[0].item() == pytest.approx(0.9)
    assert out.token_level_scores[0, spans0[1][1] - 1].item() == pytest.approx(0.9)
    assert out.token_level_scores[0, spans0[0][1] - 1].item() == pytest.approx(0.5 + 0.25)
    assert out.token_level_scores[0].sum().item() == pytest.approx(0.9 + 0.5 + 0.25)
    # row 1: the environment failed: its error score replaces the scorer's
    spans1 = turn_spans(mask[1])
    assert out.scores[1].item() == -1.0 and out.token_level_scores[1, spans1[1][1] - 1].item() == -1.0
    assert out.metrics["agent/stop_env_error"] == 0.5 and out.metrics["agent/tool_call_rate"] == 1.0


def test_run_config_builds_the_composed_manager():
    from hybridflow.config.schema import load_run_config
    from hybridflow.trainer.run.setup import build_reward_manager

    cfg = load_run_config(None, ["reward.manager.num_workers=0",
                                 "reward.templates=[{name: numeric_match, weight: 2.0}, "
                                 "{name: regex, level: turn, args: {pattern: x}}]"])
    manager = build_reward_manager(cfg, build_char_tokenizer())
    assert isinstance(manager.compute_score, ComposedScore) and len(manager.turn_templates) == 1
    with pytest.raises(ConfigError, match="reward.templates"):
        load_run_config(None, ["reward.templates=[{name: nope}]"])
