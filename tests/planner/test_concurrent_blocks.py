"""The simulator's model of the programs' `concurrently` blocks (Capabilities.blocks, i.e.
trainer.concurrent_phases: true): a block's phases on different pools take the busiest
pool's phases, calls included (the other calls' dispatch overlaps it); colocated they add
up as before; a rank beside another pool's keeps the device's measured share, not the
share_scale of a group computing in lockstep;
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
from hybridflow.planner.search import brute_force, search
from hybridflow.planner.simulate import Mapping, Pool, combine, role_profile, simulate
from planner_cases import EFF, cluster, ppo_problem

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


def test_split_ppo_block_lasts_its_busiest_pool_calls_included():
    problem = ppo_problem(4, Capabilities.here(concurrent_phases=True))
    assert problem.overlapped_blocks == ("scoring", "updates")
    c = _costs(problem)
    # Actor pool: old and reference log-probs one after another, beside the critic's values;
    # then the actor's update beside the critic's. Each phase's cost holds its call
    # (call_s, 0.1 s here): the busiest pool's calls count, the other pool's overlap it.
    scoring = max(c["old_log_prob"] + c["ref"], c["values"])
    updates = max(c["update_actor"], c["update_critic"])
    expected = c["gen"] + c["reward"] + scoring + updates
    split = simulate(problem, Mapping(SPLIT, dict(PAR)))
    assert EFF.call_s == 0.1 and split.step_s == pytest.approx(expected, rel=1e-12)
    assert split.stage_s[3:] == pytest.approx([scoring, updates], rel=1e-12)
    serial = sum(c.values())
    # What it saves: the shorter side of each block, its call included.
    saved = min(c["old_log_prob"] + c["ref"], c["values"]) + min(c["update_actor"], c["update_critic"])
    assert saved > 2 * EFF.call_s and serial - split.step_s == pytest.approx(saved, rel=1e-9)
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


@pytest.mark.parametrize("share_scale", [1.0, 0.8])
def test_a_block_phase_shares_the_node_with_the_other_pools_phases(share_scale):
    """Split 1 | 1 on a node whose devices keep half their rate while both compute: beside
    the other pool (in a block) a scoring or update phase computes at that share, alone
    (without blocks, or generation) at the full rate. share_scale, the correction for a
    group's own ranks computing in lockstep, leaves a 1-rank pool beside another alone."""
    half = cluster(2, shared=0.5, eff=dataclasses.replace(EFF, share_scale=share_scale))
    on = dataclasses.replace(ppo_problem(2, Capabilities.here(concurrent_phases=True)), cluster=half)
    off = dataclasses.replace(ppo_problem(2, Capabilities.here(concurrent_phases=False)), cluster=half)
    for role, par in (("actor", Parallel(1, gen_tp=1)), ("critic", Parallel(1))):
        costs_on, costs_off = role_profile(on, role, par)[0], role_profile(off, role, par)[0]
        for name in costs_on:
            in_block = name in ("old_log_prob", "values", "update_actor", "update_critic")
            assert costs_on[name].compute_s == pytest.approx(costs_off[name].compute_s * (2 if in_block else 1))


def test_share_scale_still_corrects_a_group_of_several_ranks_in_a_block():
    """Split 2 | 2 on one node of 4 that keep half their rate, share_scale 0.8: an update
    of a 2-rank pool computes at 0.5 x 0.8 of a device whether in a block or not (its own
    ranks share the node); on 1-device nodes nothing is shared. Hand-computed: the actor's
    update is 6 N S s + 12 L d S s^2 = 6 x 1360 x 8 x 8 + 12 x 2 x 8 x 8 x 8^2 = 620544 FLOPs
    on 2 devices of 1e9 FLOP/s at train efficiency 0.5."""
    eff = dataclasses.replace(EFF, share_scale=0.8)
    for blocks in (True, False):
        problem = dataclasses.replace(ppo_problem(4, Capabilities.here(concurrent_phases=blocks)),
                                      cluster=cluster(4, shared=0.5, eff=eff))
        update = role_profile(problem, "actor", Parallel(2, gen_tp=1))[0]["update_actor"]
        assert update.compute_s == pytest.approx(620544 / (2 * 1e9 * 0.5 * 0.5 * 0.8))
    spread = dataclasses.replace(ppo_problem(4, Capabilities.here(concurrent_phases=True)),
                                 cluster=cluster(4, per_node=1, shared=0.5, eff=eff))
    update = role_profile(spread, "actor", Parallel(2, gen_tp=1))[0]["update_actor"]
    assert update.compute_s == pytest.approx(620544 / (2 * 1e9 * 0.5))


@pytest.mark.parametrize("devices", [2, 4])
def test_search_finds_the_brute_force_optimum_with_blocks_on_a_shared_node(devices):
    """The search's Pareto fronts stay exact with the block entries and the shared rate."""
    problem = dataclasses.replace(ppo_problem(devices, Capabilities.here(concurrent_phases=True)),
                                  cluster=cluster(devices, shared=0.5))
    best, result = brute_force(problem), search(problem, top=3)
    assert best is not None and result.mappings[0].step_s == pytest.approx(best.step_s, rel=1e-9)
    for m in result.mappings:
        assert simulate(problem, Mapping(m.pools, dict(m.parallel))).step_s == pytest.approx(m.step_s)


def test_the_runs_setting_decides_and_the_declaration_is_checked(tmp_path):
    def blocks(*overrides: str) -> tuple[str, ...]:
        cfg = load_run_config(None, list(overrides))
        caps = Capabilities.for_run(cfg)
        assert caps.blocks is cfg.trainer.concurrent_phases and not caps.overlap
        return problem_from_config(cfg, ppo_problem().cluster, caps).overlapped_blocks

    on, off = "trainer.concurrent_phases=true", "trainer.concurrent_phases=false"
    assert blocks("algorithm.name=ppo", "actor.old_log_probs=recompute", on) == ("scoring", "updates")
    assert blocks("algorithm.name=ppo", "actor.old_log_probs=recompute", off) == ()
    # Fused old log-probs and no reference: the critic's values are alone in their block.
    assert blocks("algorithm.name=ppo", "actor.old_log_probs=auto", on) == ("updates",)
    # GRPO's old and reference log-probs share a block, and always the actor's processes.
    assert blocks("algorithm.name=grpo", "actor.old_log_probs=recompute", "actor.loss.use_kl_loss=true", on) == ()
    with pytest.raises(ValueError, match="overlap .* already covers blocks"):
        Capabilities(overlap=True, blocks=True)
    with pytest.raises(ValueError, match="a generate phase cannot be in a concurrently block"):
        FlowPhase("gen", "actor", "generate", block="scoring")


def test_cli_plans_with_the_configs_setting(tmp_path):
    """`hybridflow plan` (the trainer's runtime) reads trainer.concurrent_phases: with it the
    split mappings are faster than without, the colocated ones the same."""
    best = {}
    for setting in ("true", "false"):
        out = tmp_path / f"plan_{setting}.json"
        assert main(["plan", "--nodes", "1", "--devices-per-node", "8", "--device", "a100-80gb", "--model",
                     "llama-7b", "--top", "50", "--json", str(out), "algorithm.name=ppo", "data.train_batch_size=64",
                     "rollout.n=1", "actor.micro_batch.mini_batch_size=64", "critic.micro_batch.mini_batch_size=64",
                     "actor.old_log_probs=recompute", f"trainer.concurrent_phases={setting}"]) == 0
        result = json.loads(out.read_text())
        assert result["overlapped_blocks"] == (["scoring", "updates"] if setting == "true" else [])
        mappings = result["mappings"]
        assert all(len(m["stage_s"]) == (5 if setting == "true" else 3) for m in mappings)
        best[setting] = {placement: min(m["step_s"] for m in mappings if m["placement"] == placement)
                         for placement in ("colocated", "actor | critic")}
    assert best["true"]["colocated"] == pytest.approx(best["false"]["colocated"], rel=1e-12)
    assert best["true"]["actor | critic"] < best["false"]["actor | critic"]
