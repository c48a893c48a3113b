"""The run config tree: defaults, overrides, and the cross-section checks that run before
any worker starts (no Ray needed here)."""

from __future__ import annotations

import pytest

from hybridflow.config import ConfigError, load_config
from hybridflow.config.schema import DEMO_PRESETS, RunConfig, load_run_config, resolve_run_config, run_config_from_tree
from hybridflow.config.validation import validate_run_config
from hybridflow.rewards.limits import auto_memory_limit_mb
from hybridflow.trainer.run.run_dir import create_run_dir


def test_default_config_is_valid_and_is_the_builtin_demo():
    cfg = load_run_config()
    layout = validate_run_config(cfg)
    assert cfg.model.path is None and not cfg.data.train_files  # built-in model and task
    assert cfg.algorithm.name == "grpo" and cfg.algorithm.estimator == "grpo"
    assert cfg.sft.steps > 0  # the demo warm-starts before RL
    assert layout.sequences_per_step == cfg.data.train_batch_size * cfg.rollout.n


def test_overrides_reach_nested_sections_and_keep_the_demo_presets():
    cfg = load_run_config(None, ["actor.optim.grad_clip=0.5", "rollout.n=16", "algorithm.name=ppo"])
    presets = dict(DEMO_PRESETS)
    assert cfg.actor.optim.grad_clip == 0.5
    assert cfg.actor.optim.lr == presets["actor.optim.lr"]  # the demo's, not OptimConfig's
    assert cfg.rollout.n == 16 and cfg.rollout.response_length == presets["rollout.response_length"]
    assert cfg.algorithm.estimator == "gae" and cfg.use_critic


@pytest.mark.parametrize("override, closest", [
    ("actor.optim.lrr=1e-4", "lr"),
    ("algoritm.name=ppo", "algorithm"),
    ("rollout.temprature=0.5", "temperature"),
    ("data.train_batch_sise=8", "train_batch_size"),
])
def test_unknown_key_names_the_closest_valid_key(override, closest):
    with pytest.raises(ConfigError, match=rf"unknown config key; did you mean '{closest}'") as err:
        load_run_config(None, [override])
    assert override.split("=")[0].startswith(err.value.key)  # the key up to its first unknown part


@pytest.mark.parametrize("overrides, key, message", [
    # prompts must divide over the generation groups (2 ranks / rollout tp 1)
    (["resources.world_size=2", "data.train_batch_size=3"], "data.train_batch_size",
     r"3 prompts cannot be shared by the 2"),
    # sequences per step (16 x 8) vs the actor's mini-batch
    (["resources.world_size=2", "actor.micro_batch.mini_batch_size=48"], "actor.micro_batch.mini_batch_size",
     r"128 sequences per step"),
    # mini-batch per dp rank vs micro-batch size
    (["resources.world_size=2", "actor.micro_batch.mini_batch_size=64",
      "actor.micro_batch.micro_batch_size_per_device=24"], "actor.micro_batch.micro_batch_size_per_device",
     r"24 does not divide the 32 sequences of a mini-batch per dp rank"),
    # mini-batch vs data-parallel size
    (["resources.world_size=4", "data.train_batch_size=4", "rollout.n=3", "actor.micro_batch.mini_batch_size=6",
      "actor.micro_batch.micro_batch_size_per_device=1"], "actor.micro_batch.mini_batch_size",
     r"6 is not divisible by the data-parallel size 4"),
    (["resources.world_size=2", "actor.tp_size=3"], "actor.tp_size", r"3 does not divide the 2 ranks"),
    (["resources.world_size=2", "rollout.tensor_model_parallel_size=4"], "rollout.tensor_model_parallel_size",
     r"4 does not divide the actor's 2 ranks"),
    (["resources.world_size=2", "resources.placement=split"], "resources.placement", r"has no critic"),
    (["resources.world_size=2", "resources.placement=split", "algorithm.name=ppo", "resources.critic_ranks=2"],
     "resources.critic_ranks", r"2 must leave the actor"),
    (["resources.world_size=2", "sft.batch_size=50"], "sft.micro_batch_size_per_device",
     r"128 does not divide the 25 sequences of a mini-batch per dp rank \(50 / dp 2\)"),
    (["resources.world_size=2", "sft.batch_size=51", "sft.micro_batch_size_per_device=1"], "sft.batch_size",
     r"51 is not divisible by the data-parallel size 2"),
    (["resources.world_size=2", "actor.param_offload=true"], "actor.param_offload", r"CPU-only run"),
    (["rollout.response_length=60"], "rollout.response_length", r"exceed the built-in model"),
    (["data.train_files=[a.parquet]"], "sft.steps", r"sft.files is empty"),
])
def test_inconsistent_sizes_are_refused_with_the_keys_to_change(overrides, key, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_run_config(None, overrides)
    assert err.value.key == key


def test_algorithm_errors_name_the_keys():
    with pytest.raises(ConfigError, match=r"needs rollout.n >= 2"):
        load_run_config(None, ["rollout.n=1"])


def test_the_algorithm_is_named_in_any_case_and_flat_as_in_environment_tasks():
    # RLTrainer({"algorithm": "PPO", "env": ...}) runs; {"algorithm": "GRPO"} was "algorithm: expected a
    # section (mapping), got 'GRPO'" and algorithm.name=PPO "'PPO' is not a registered algorithm".
    assert run_config_from_tree({"algorithm": "GRPO"}).algorithm.name == "grpo"
    assert load_run_config(None, ["algorithm.name=PPO"]).algorithm.name == "ppo"
    with pytest.raises(ConfigError,
                       match=r"^algorithm.name: 'grpoo' is not a registered algorithm; did you mean 'grpo'"):
        run_config_from_tree({"algorithm": "grpoo"})


@pytest.mark.parametrize("overrides, key, message", [
    # the algorithm section's own checks (algorithm.py) name at least the section
    (["algorithm.name=ppo", "algorithm.adv_estimator=grpo"], "algorithm",
     r"ppo trains a critic and uses adv_estimator=gae"),
    (["algorithm.adv_estimator=gae"], "algorithm", r"needs a group estimator"),
    (["algorithm.adv_estimator=nope"], "algorithm", r"nope"),
    (["trainer.total_steps=0"], "trainer.total_steps", r"must be >= 1"),
    (["actor.micro_batch.micro_batch_size_per_device=0"], "actor.micro_batch.micro_batch_size_per_device",
     r"must be an integer >= 1"),
    (["name=a/b"], "name", r"directory-safe"),
])
def test_section_errors_name_the_section(overrides, key, message):
    with pytest.raises(ConfigError, match=message) as err:
        load_run_config(None, overrides)
    assert err.value.key == key or err.value.key.startswith(f"{key}.")


def test_world_size_null_resolves_to_a_power_of_two():
    world = RunConfig().resources.resolved_world_size()
    assert world >= 1 and world & (world - 1) == 0 and world <= 8


def test_run_dir_holds_the_resolved_config_and_is_never_reused(tmp_path):
    cfg = resolve_run_config(load_run_config(None, [f"trainer.output_dir={tmp_path}", "rollout.temperature=0.7",
                                                    "name=probe", "resources.world_size=null"]))
    assert cfg.resources.world_size is not None and cfg.algorithm.adv_estimator == "grpo"
    # The reward workers' limits as this machine gives them ("auto" was saved: the run's choice unrecorded).
    manager = cfg.reward.manager
    assert (manager.memory_limit_mb, manager.cpu_time_s) == (auto_memory_limit_mb(manager.num_workers), 10)
    first, second = create_run_dir(cfg), create_run_dir(cfg)  # same second: distinct directories
    assert first != second and first.parent == second.parent == tmp_path
    assert load_config(RunConfig, first / "config.yaml") == cfg
    explicit = load_run_config(None, [f"trainer.run_dir={first}"])
    with pytest.raises(ConfigError, match="already exists"):
        create_run_dir(explicit)


def test_every_example_config_validates_and_says_how_to_run_it():
    from pathlib import Path

    from hybridflow.config.loader import user_tree
    from hybridflow.config.rm_schema import load_rm_config
    from hybridflow.config.tasks import read_task_config

    examples = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))
    assert len(examples) >= 4
    for path in examples:
        lines = path.read_text().splitlines()
        header = lines[:next(i for i, line in enumerate(lines) if not line.startswith("#"))]
        commands = [c for c in ("train", "sft", "rm", "plan") if any(f"hybridflow {c} --config" in h for h in header)]
        assert commands, f"{path.name}: the header must say how to run it (hybridflow train|sft|rm|plan --config ...)"
        if commands == ["rm"]:
            load_rm_config(path)
        else:  # a language-model run or an environment task, as `hybridflow train` reads it
            read_task_config(user_tree(path))


def test_null_layout_on_cpu_is_one_rank_with_every_core():
    # 1 rank x all cores beat one rank per core on both vs-TRL workloads (docs/performance.md); the
    # resolved values are what the run saves and what the ranks' CPU slots get.
    from hybridflow.config.sections.resources import local_cores
    from hybridflow.trainer.run.setup import placement

    # (omp_wait_policy inherit: "auto" would give a machine that other work shares fewer
    # threads, tests/controller/test_omp.py)
    cfg = resolve_run_config(load_run_config(None, ["resources.omp_wait_policy=inherit"]))
    assert (cfg.resources.world_size, cfg.resources.threads_per_rank) == (1, local_cores())
    layout = validate_run_config(cfg)
    assert placement(cfg, layout, ["actor"]).cpus_per_slot == local_cores()
    two = resolve_run_config(load_run_config(None, ["resources.world_size=2", "resources.omp_wait_policy=inherit"])).resources
    assert two.threads_per_rank == max(1, local_cores() // 2)
    pinned = resolve_run_config(load_run_config(None, ["resources.threads_per_rank=3"])).resources
    assert (pinned.world_size, pinned.threads_per_rank) == (1, 3)
    cluster = load_run_config(None, ["resources.ray_address=10.0.0.1:6379"]).resources
    assert cluster.resolved_threads_per_rank(cluster.resolved_world_size()) == 1
    split = load_run_config(None, ["algorithm.name=ppo", "resources.placement=split"]).resources
    assert split.resolved_world_size() == 2  # the critic's rank + at least one for the actor


def test_threads_per_rank_must_be_positive():
    with pytest.raises(ConfigError, match="must be >= 1") as err:
        load_run_config(None, ["resources.threads_per_rank=0"])
    assert err.value.key == "resources.threads_per_rank"


@pytest.mark.parametrize("override, key", [
    ("data.prompt.max_prompt_length=0", "data.prompt.max_prompt_length"),
    ("data.prompt.truncation=middle", "data.prompt.truncation"),
    ("sft.data.max_length=1", "sft.data.max_length"),
    ("reward.manager.num_workers=-1", "reward.manager.num_workers"),
    ("reward.manager.timeout_s=0", "reward.manager.timeout_s"),
    # The sampling defaults were named "rollout: the sampling defaults are invalid: invalid SamplingParams: n ..."
    ("rollout.n=0", "rollout.n"),
    ("rollout.temperature=-1", "rollout.temperature"),
    ("rollout.top_p=2", "rollout.top_p"),
    ("rollout.response_length=0", "rollout.response_length"),
])
def test_a_bad_setting_is_named_by_its_full_dotted_key(override, key):
    with pytest.raises(ConfigError) as err:
        load_run_config(None, [override])
    assert str(err.value).startswith(f"{key}: ")
