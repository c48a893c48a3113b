"""The simulator's model of the programs' `concurrently` blocks (Capabilities.blocks, i.e.
trainer.concurrent_phases: true): a block's phases on different pools take the busiest
pool's share plus the controller's dispatch of every call; colocated they add up as before;
which phases overlap comes from the dataflow's declaration (FlowPhase.block), and whether
they do from the run's setting. Hand-computed from the cost model's phase costs, no runs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hybridflow.cli import main
from hybridflow.config.dataflow import FlowPhase
from hybridflow.config.schema import load_run_config
from hybridflow.planner.cost import Parallel
from hybridflow.planner.problem import Capabilities, problem_from_config
from hybridflow.planner.simulate import Mapping, Pool, combine, role_profile, simulate
from planner_cases import EFF, ppo_problem

PAR = {"actor": Parallel(2, gen_tp=1), "reference": Parallel(2), "critic": Parallel(2)}
SPLIT = (Pool(("actor", "reference"), 2), Pool(("critic",), 2))
COLOCATED = (Pool(("actor", "reference", "critic"), 2),)


def _costs(problem) -> dict[str, float]:
    """Seconds of each phase of the PPO problem on PAR (the reward runs on the controller: 0 s here)."""
    out = {"reward": 0.0}  # controller_per_seq_s is 0 in the test efficiency
    for role, par in PAR.items():
        costs, _ = role_profile(problem, role, par)
        out.update({name: cost.seconds for name, cost in costs.items()})
    return out


def _step(problem, pools) -> float:
    return simulate(problem, Mapping(pools, dict(PAR))).step_s


def test_combine_takes_each_blocks_busiest_pool_and_sums_the_rest():
    # entries: generation, scoring, updates, then two blocks
    pools = [[1.0, 2.0, 3.0, 4.0, 1.0], [2.0, 1.0, 1.0, 3.0, 5.0], [0.0, 0.5, 0.0, 0.0, 0.0]]
    assert combine(pools, overlap=False) == (3.0 + 3.5 + 4.0 + 4.0 + 5.0, [3.0, 3.5, 4.0, 4.0, 5.0])
    assert combine([p[:3] for p in pools], overlap=False) == (10.5, [3.0, 3.5, 4.0])  # no blocks: as before


def test_split_ppo_block_lasts_its_busiest_pool_plus_every_calls_dispatch():
    problem = ppo_problem(4, Capabilities.here(concurrent_phases=True))
    assert problem.overlapped_blocks == ("scoring", "updates")
    c, call = _costs(problem), EFF.call_s
    # Actor pool: old and reference log-probs one after another, beside the critic's values;
    # then the actor's update beside the critic's. Each of the 5 calls' dispatch is serial.
    scoring = max(c["old_log_prob"] + c["ref"] - 2 * call, c["values"] - call)
    updates = max(c["update_actor"] - call, c["update_critic"] - call)
    expected = c["gen"] + c["reward"] + 5 * call + scoring + updates
    split = simulate(problem, Mapping(SPLIT, dict(PAR)))
    assert split.step_s == pytest.approx(expected, rel=1e-12)
    assert split.stage_s[3:] == pytest.approx([scoring, updates], rel=1e-12)
    serial = sum(c.values())
    # What it saves: the shorter side of each block (both sides do work here).
    saved = min(c["old_log_prob"] + c["ref"] - 2 * call, c["values"] - call) + \
        min(c["update_actor"] - call, c["update_critic"] - call)
    assert saved > 0.01 and serial - split.step_s == pytest.approx(saved, rel=1e-9)
    assert _step(ppo_problem(4, Capabilities.here(concurrent_phases=False)), SPLIT) == pytest.approx(serial, rel=1e-12)


def test_colocated_blocks_add_up_as_without_them():
    on = ppo_problem(4, Capabilities.here(concurrent_phases=True))
    off = ppo_problem(4, Capabilities.here(concurrent_phases=False))
    assert _step(on, COLOCATED) == pytest.approx(_step(off, COLOCATED), rel=1e-12)
    assert _step(off, COLOCATED) == pytest.approx(sum(_costs(off).values()), rel=1e-12)
    assert off.overlapped_blocks == ()


def test_what_overlaps_is_the_declared_blocks_not_the_phase_names():
    problem = ppo_problem(4, Capabilities.here(concurrent_phases=True))
    undeclared = dataclasses.replace(problem, phases=tuple(dataclasses.replace(p, block=None) for p in problem.phases))
    assert undeclared.overlapped_blocks == ()
    assert _step(undeclared, SPLIT) == pytest.approx(sum(_costs(problem).values()), rel=1e-12)
    # Other names, same grouping: the same prediction.
    renamed = dataclasses.replace(problem, phases=tuple(
        dataclasses.replace(p, block=p.block and f"block of {p.block}") for p in problem.phases))
    assert renamed.overlapped_blocks == ("block of scoring", "block of updates")
    assert _step(renamed, SPLIT) == pytest.approx(_step(problem, SPLIT), rel=1e-12)
    # Only the updates declared together: the scoring phases add up again.
    updates_only = dataclasses.replace(problem, phases=tuple(
        dataclasses.replace(p, block=None) if p.block == "scoring" else p for p in problem.phases))
    assert _step(problem, SPLIT) < _step(updates_only, SPLIT) < _step(undeclared, SPLIT)


def test_the_runs_setting_decides_and_the_declaration_is_checked(tmp_path):
    for setting in (True, False):
        cfg = load_run_config(None, ["algorithm.name=ppo", f"trainer.concurrent_phases={str(setting).lower()}"])
        caps = Capabilities.for_run(cfg)
        assert caps.blocks is setting and not caps.overlap
        problem = problem_from_config(cfg, ppo_problem().cluster, caps)
        assert problem.overlapped_blocks == (("scoring", "updates") if setting else ())
    with pytest.raises(ValueError, match="overlap .* already covers blocks"):
        Capabilities(overlap=True, blocks=True)
    with pytest.raises(ValueError, match="a generate phase cannot be in a concurrently block"):
        FlowPhase("gen", "actor", "generate", block="scoring")


@pytest.mark.parametrize("setting", ["true", "false"])
def test_cli_plans_with_the_configs_setting(setting, tmp_path):
    out = tmp_path / "plan.json"
    args = ["plan", "--nodes", "1", "--devices-per-node", "8", "--device", "a100-80gb", "--model", "llama-7b",
            "--top", "50", "--json", str(out), "algorithm.name=ppo", "data.train_batch_size=64", "rollout.n=1",
            "actor.micro_batch.mini_batch_size=64", "critic.micro_batch.mini_batch_size=64",
            f"trainer.concurrent_phases={setting}"]
    assert main(args) == 0
    result = json.loads(out.read_text())
    assert result["overlapped_blocks"] == (["scoring", "updates"] if setting == "true" else [])
    split = [m for m in result["mappings"] if m["placement"] != "colocated"]
    assert split  # a split mapping is among the 50 best
    for m in split:
        blocks = m["stage_s"][3:]
        assert len(blocks) == (2 if setting == "true" else 0)
