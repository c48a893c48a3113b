"""`run_selfcheck` on the session's embedded Ray, and `init_ray`'s argument checks."""

from __future__ import annotations

import pytest

from hybridflow.controller import init_ray, run_selfcheck


def test_selfcheck_all_reduces_over_gloo(ray_local):
    report = run_selfcheck(world_size=2)
    assert report["ok"]
    assert report["all_reduce"] == {"result": [3.0, 3.0], "expected": 3.0}
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert {r["backend"] for r in report["ranks"]} == {"gloo"}
    assert report["embedded_ray"] and report["ray_address"].startswith("127.0.0.1:")
    assert report["nodes"] == 1
    assert set(report["timings_s"]) == {"ray_start", "spawn_group", "all_reduce_call", "total"}


def test_init_ray_refuses_num_cpus_for_a_joined_cluster():
    with pytest.raises(ValueError, match="only applies to an embedded Ray"):
        init_ray(address="10.0.0.1:6379", num_cpus=4)


def test_embedded_workers_run_at_the_controllers_priority(ray_local):
    # Ray's default niceness 15 would hand the workers' CPU to any other job on the machine.
    import os

    import ray

    @ray.remote(num_cpus=0)
    def niceness() -> int:
        return os.nice(0)

    if os.environ.get("RAY_worker_niceness", "0") != "0":
        pytest.skip("the user set RAY_worker_niceness")
    assert ray.get(niceness.remote()) == os.nice(0)
