"""The simulator's timing and overlap rules, memory rejection with reasons, and the search
against brute force on small cases."""

from __future__ import annotations

import pytest

from hybridflow.planner.cost import Parallel
from hybridflow.planner.problem import Capabilities
from hybridflow.planner.search import brute_force, placements, pool_sizes, search, set_partitions, splits
from hybridflow.planner.simulate import Infeasible, Mapping, Pool, combine, role_profile, simulate
from planner_cases import ppo_problem


def test_combine_overlaps_pools_within_a_stage_only():
    pools = [[1.0, 2.0, 3.0], [2.0, 1.0, 1.0], [0.0, 0.5, 0.0]]
    assert combine(pools, overlap=True) == (7.0, [2.0, 2.0, 3.0])
    assert combine(pools, overlap=False) == (10.5, [3.0, 3.5, 4.0])


def _stage_sums(problem, role, par):
    costs, _ = role_profile(problem, role, par)
    out = [0.0, 0.0, 0.0]
    for phase in problem.phases:
        if phase.role == role:
            out[phase.stage] += costs[phase.name].seconds
    return out


@pytest.mark.parametrize("overlap", [True, False])
def test_simulate_shared_pool_is_sequential_and_split_pools_overlap(overlap):
    problem = ppo_problem(4, Capabilities(overlap=overlap))
    par = {"actor": Parallel(2, gen_tp=1), "reference": Parallel(2), "critic": Parallel(2)}
    split = simulate(problem, Mapping((Pool(("actor", "reference"), 2), Pool(("critic",), 2)), dict(par)))
    a = [x + y for x, y in zip(_stage_sums(problem, "actor", par["actor"]),
                               _stage_sums(problem, "reference", par["reference"]))]
    c = _stage_sums(problem, "critic", par["critic"])
    ctrl = 0.0  # controller_per_seq_s is 0 in the test efficiency
    if overlap:
        assert split.step_s == pytest.approx(sum(max(x, y) for x, y in zip(a, c)) + ctrl)
    else:
        assert split.step_s == pytest.approx(sum(a) + sum(c))
    colocated = simulate(problem, Mapping((Pool(("actor", "reference", "critic"), 2),), dict(par)))
    assert colocated.step_s == pytest.approx(sum(a) + sum(c))  # one pool: always one after another
    assert set(split.phase_s) == {"gen", "reward", "old_log_prob", "ref", "values", "update_critic", "update_actor"}


def test_infeasible_mapping_says_where_and_by_how_much():
    problem = ppo_problem(2, memory=30_000)  # 27 kB usable; the actor alone keeps 23.7 kB resident on 1 rank
    m = Mapping((Pool(("actor", "reference", "critic"), 2),),
                {"actor": Parallel(2, gen_tp=1), "reference": Parallel(2), "critic": Parallel(2)})
    with pytest.raises(Infeasible, match=r"pool actor\+reference\+critic on 2 devices: peak .* KiB > 26.37 KiB usable at"):
        simulate(problem, m)


def test_enumeration_helpers():
    assert len(list(set_partitions(["a", "b", "c", "d"]))) == 15  # Bell number B4
    assert pool_sizes(32, 8) == [1, 2, 4, 8, 16, 24, 32]
    assert sorted(splits(8, 2, pool_sizes(8, 4))) == [(4, 4)]  # a pool is 1, 2, 4 devices or whole nodes
    assert sorted(splits(3, 2, pool_sizes(3, 3))) == [(1, 2), (2, 1)]
    here = placements(ppo_problem(4, Capabilities.here(concurrent_phases=False)))
    assert sorted(here) == sorted([[("actor", "reference", "critic")], [("actor", "reference"), ("critic",)]])


@pytest.mark.parametrize("caps", [Capabilities(), Capabilities.here(concurrent_phases=False),
                                  Capabilities.here(concurrent_phases=True), Capabilities(overlap=False)],
                         ids=["paper", "trainer", "trainer-concurrent", "no-overlap"])
@pytest.mark.parametrize("memory", [1e9, 60_000], ids=["roomy", "tight"])
def test_search_finds_the_brute_force_optimum(caps, memory):
    problem = ppo_problem(4, caps, memory=memory)
    best = brute_force(problem)
    result = search(problem, top=3)
    assert best is not None and result.mappings
    assert result.mappings[0].step_s == pytest.approx(best.step_s, rel=1e-9)
    assert [m.step_s for m in result.mappings] == sorted(m.step_s for m in result.mappings)
    for m in result.mappings:  # what the search reports is what the simulator says
        assert simulate(problem, Mapping(m.pools, dict(m.parallel))).step_s == pytest.approx(m.step_s)
    if memory < 1e9:
        assert result.rejected and all("usable at" in r or "no mapping that fits" in r for r in result.rejected)
