"""Config errors are reported before torch, Ray or transformers is imported.

`hybridflow train bad.key=1` must answer in about a second, so the config classes, the
registries they check names against and the CLI path up to validation import nothing
heavy (docs/robustness.md). The test runs the CLI in a fresh interpreter and looks at
`sys.modules` at the moment each error is printed; the declared built-in names of the
lazy registries are checked against what their modules register.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "ray", "transformers")

# (command line, text the error must contain): an unknown key, a wrong type, a bad value,
# a registry name, a cross-section size error, a backend that cannot run TP, and the
# other config trees (sft, rm, an environment task).
CASES = [
    (["train", "bad.key=1"], "bad: unknown key; known keys: actor"),
    (["train", "enviroment=CartPole-v1"], "enviroment: unknown key; did you mean env?"),
    (["train", "trainer.total_steps=many"], "trainer.total_steps"),
    (["train", "rollout.temperature=-1"], "rollout.temperature: must be >= 0"),
    (["train", "algorithm.adv_estimator=grpoo"], "did you mean 'grpo'"),
    (["train", "actor.loss.policy.loss_agg_mode=tokenmean"], "loss aggregation mode"),
    (["train", "data.train_batch_size=7"], "does not divide the data.train_batch_size (7)"),
    (["train", "rollout.name=hf", "rollout.tensor_model_parallel_size=2"], "generates on one rank only"),
    (["train", "rollout.reshard_method=fast"], "unknown reshard method"),
    (["sft", "sft.steps=x"], "sft.steps"),
    (["rm", "engine.nope=1"], "engine.nope: unknown config key"),
    (["train", "--config", str(ROOT / "examples" / "ppo_cartpole.yaml"), "ppo.bad=1"], "ppo.bad"),
]

PROBE = """
import contextlib, io, json, sys
from hybridflow.cli import main
cases = json.loads(sys.argv[1])
out = []
for argv in cases:
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = main(argv)
    out.append({"rc": rc, "stderr": err.getvalue(), "heavy": [m for m in %r if m in sys.modules]})
print(json.dumps(out))
""" % (HEAVY,)


def test_config_errors_are_reported_before_torch_ray_or_transformers_is_imported(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", PROBE, json.dumps([argv for argv, _ in CASES])], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    for (argv, expected), result in zip(CASES, results):
        assert result["rc"] == 2, (argv, result)
        assert expected in result["stderr"] and "config error" in result["stderr"], (argv, result["stderr"])
        assert "Traceback" not in result["stderr"]
        assert result["heavy"] == [], f"{argv} imported {result['heavy']} before reporting its config error"
    assert not any(tmp_path.iterdir()), "a failed start must leave nothing behind"


def test_a_valid_config_still_loads_torch_free():
    """The whole run config (defaults, resolution, cross-section checks) loads without torch."""
    code = ("import sys; from hybridflow.config.schema import load_run_config; "
            "cfg = load_run_config(None, ['rollout.n=16', 'rollout.temperature=0.7']); "
            "print([m for m in %r if m in sys.modules])" % (HEAVY,))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


@pytest.mark.parametrize("registry_name", ["ADV_ESTIMATORS", "POLICY_LOSSES", "LOSS_AGG_MODES", "KL_ESTIMATORS"])
def test_declared_builtin_names_are_what_their_modules_register(registry_name):
    from hybridflow.algorithms import settings

    registry = getattr(settings, registry_name)
    for module in set(registry.builtins.values()):
        importlib.import_module(module)
    registered = {name: fn.__module__ for name, fn in registry.loaded().items() if fn.__module__.startswith("hybridflow.")}
    assert registered == registry.builtins


def test_declared_rollout_backends_match_their_classes():
    from hybridflow.engines.rollout import registry

    assert set(registry.BUILTIN_TENSOR_PARALLEL) == set(registry._BACKENDS.builtins)
    for name, tensor_parallel in registry.BUILTIN_TENSOR_PARALLEL.items():
        cls = registry.rollout_backend(name)
        assert cls.__module__ == registry._BACKENDS.builtins[name]
        assert cls.supports_tensor_parallel is tensor_parallel
    assert set(registry.BUILTIN_MULTI_TURN) == set(registry._BACKENDS.builtins)
    for name, turns in registry.BUILTIN_MULTI_TURN.items():
        assert registry._runs_turns(registry.rollout_backend(name)) is turns, name
