"""`resources.placement: auto` end to end: PPO on 2 CPU ranks (Ray), one step; the planner's
mapping becomes the run's settings (config.yaml) and its prediction plan.json; and the
mapping -> settings translation for a split mapping."""

from __future__ import annotations

import json

from hybridflow import RLTrainer
from hybridflow.config import load_config
from hybridflow.config.schema import RunConfig, load_run_config
from hybridflow.config.validation import validate_run_config
from hybridflow.planner.apply import mapping_config
from hybridflow.planner.cost import Parallel
from hybridflow.planner.simulate import Mapping, Pool

TINY = [
    "trainer.console=none", "trainer.total_steps=1", "trainer.test_freq=0", "trainer.save_final_model=false",
    "trainer.val_before_train=false", "resources.world_size=2", "sft.steps=0",
    "model.builtin.hidden_size=32", "model.builtin.intermediate_size=64", "model.builtin.num_hidden_layers=2",
    "data.train_batch_size=4", "rollout.n=2", "data.builtin.num_train=64", "data.builtin.num_val=8",
    "actor.micro_batch.mini_batch_size=4", "actor.micro_batch.micro_batch_size_per_device=2",
    "critic.micro_batch.mini_batch_size=4", "critic.micro_batch.micro_batch_size_per_device=2",
    "reward.manager.num_workers=1", "algorithm.name=ppo",
]


def test_split_mapping_becomes_split_settings(tmp_path):
    cfg = load_run_config(None, [f"trainer.output_dir={tmp_path}", *TINY, "resources.placement=auto"])
    mapping = Mapping((Pool(("actor",), 1), Pool(("critic",), 1)),
                      {"actor": Parallel(1, gen_tp=1), "critic": Parallel(1)})
    out = mapping_config(cfg, mapping)
    assert (out.resources.placement, out.resources.critic_ranks, out.resources.world_size) == ("split", 1, 2)
    layout = validate_run_config(out)
    assert (layout.actor_ranks, layout.critic_ranks) == (1, 1)
    tp = mapping_config(cfg, Mapping((Pool(("actor", "critic"), 2),),
                                     {"actor": Parallel(1, tp=2, gen_tp=2), "critic": Parallel(2)}))
    assert (tp.resources.placement, tp.actor.tp_size, tp.rollout.tensor_model_parallel_size, tp.critic.tp_size) == \
        ("colocated", 2, 2, 1)


def test_auto_placement_runs_the_planned_mapping(ray_local, tmp_path):
    cfg = load_run_config(None, [f"trainer.output_dir={tmp_path}", *TINY, "resources.placement=auto"])
    with RLTrainer(cfg) as trainer:
        result = trainer.train(steps=1)
        actor_ranks = len(trainer.groups["actor"].worker_info)
    saved = load_config(RunConfig, result.run_dir / "config.yaml")
    plan = json.loads((result.run_dir / "plan.json").read_text())
    assert saved.resources.placement in ("colocated", "split")
    assert plan["placement"] == ("colocated" if saved.resources.placement == "colocated" else "actor | critic")
    assert saved.actor.tp_size == plan["parallel"]["actor"]["tp"]
    assert saved.rollout.tensor_model_parallel_size == plan["parallel"]["actor"]["gen_tp"]
    assert actor_ranks == plan["pools"][0]["devices"]
    assert plan["step_s"] > 0 and set(plan["phase_s"]) >= {"gen", "values", "update_critic", "update_actor"}
