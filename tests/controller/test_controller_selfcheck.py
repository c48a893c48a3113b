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
