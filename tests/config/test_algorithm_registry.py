"""The algorithm registry (hybridflow/config/algorithm.py): names come from the registry, a
user's module registers a row with `@register_algorithm` and the config finds it through
`algorithm.module` (a .py file or a dotted module) or a plain import, and the row (critics,
presets, settings section, cost, check) drives validation. No workers here: the programs
written below never run (test_custom_algorithm.py runs one)."""

from __future__ import annotations

import importlib
import textwrap

import pytest

import hybridflow.config.algorithm as algorithm_registry
from hybridflow.config import ConfigError
from hybridflow.config.algorithm import AlgorithmSpec, add_algorithm, algorithm_names, register_algorithm
from hybridflow.config.schema import load_run_config


@pytest.fixture(autouse=True)
def registry(monkeypatch):
    """Rows registered by a test are gone after it (the built-in ones stay)."""
    monkeypatch.setattr(algorithm_registry, "ALGORITHMS", algorithm_registry.ALGORITHMS.copy())


def _program(step, roles, cfg, state) -> None:
    raise AssertionError("config tests never run a program")


def _write_module(path, spec_source: str, extra: str = "") -> str:
    """A user module that registers AlgorithmSpec(<spec_source>) with a do-nothing program."""
    path.write_text(textwrap.dedent("""\
        from hybridflow.config import ConfigError
        from hybridflow.config.algorithm import AlgorithmSpec, register_algorithm
        {extra}

        @register_algorithm(AlgorithmSpec({spec}))
        def program(step, roles, cfg, state):
            pass
        """).format(spec=spec_source, extra=extra))
    return str(path)


def test_unknown_name_lists_the_registered_algorithms_and_the_closest():
    with pytest.raises(ConfigError, match=r"algorithm.name: 'grp' is not a registered algorithm; did you mean 'grpo'\? "
                                          r"Registered: grpo, ppo, .*safe_rlhf.*algorithm.module"):
        load_run_config(None, ["algorithm.name=grp"])


def test_a_module_file_registers_an_algorithm_whose_row_drives_the_config(tmp_path):
    check = textwrap.dedent("""
        def check(cfg):
            if cfg.rollout.temperature != 1.0:
                raise ConfigError("probe_ppo samples at temperature 1")
        """)
    module = _write_module(tmp_path / "probe.py", 'name="probe_ppo", estimators=("gae",), critics=("critic",), '
                           'presets=(("algorithm.lam", 0.9),), check=check', extra=check)
    split = ["resources.world_size=2", "resources.placement=split"]  # refused for algorithms without a critic
    cfg = load_run_config(None, ["algorithm.name=probe_ppo", f"algorithm.module={module}", *split])
    assert "probe_ppo" in algorithm_names()
    assert cfg.use_critic and cfg.algorithm.spec.trained_roles == ("actor", "critic")
    assert cfg.algorithm.estimator == "gae" and cfg.algorithm.lam == 0.9  # default estimator, preset
    # Loading the same file again (a second config, a resumed run) registers nothing twice.
    assert load_run_config(None, ["algorithm.name=probe_ppo", f"algorithm.module={module}"]).algorithm.lam == 0.9
    with pytest.raises(ConfigError, match="probe_ppo samples at temperature 1"):
        load_run_config(None, ["algorithm.name=probe_ppo", f"algorithm.module={module}", "rollout.temperature=0.5"])
    with pytest.raises(ConfigError, match=r"probe_ppo trains a critic and uses adv_estimator=gae"):
        load_run_config(None, ["algorithm.name=probe_ppo", f"algorithm.module={module}", "algorithm.adv_estimator=grpo"])


def test_a_dotted_module_or_a_plain_import_makes_the_name_known(tmp_path, monkeypatch):
    package = tmp_path / "probe_algos_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    _write_module(package / "dotted.py", 'name="probe_dotted", estimators=("rloo",), min_samples=2')
    _write_module(package / "plain.py", 'name="probe_plain", estimators=("remax",)')
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = load_run_config(None, ["algorithm.name=probe_dotted", "algorithm.module=probe_algos_pkg.dotted"])
    assert cfg.algorithm.estimator == "rloo"
    with pytest.raises(ConfigError, match=r"probe_dotted compares the samples .* rollout.n >= 2"):
        load_run_config(None, ["algorithm.name=probe_dotted", "algorithm.module=probe_algos_pkg.dotted", "rollout.n=1"])
    with pytest.raises(ConfigError, match="'probe_plain' is not a registered algorithm"):
        load_run_config(None, ["algorithm.name=probe_plain"])
    importlib.import_module("probe_algos_pkg.plain")  # what a user's script does before building the config
    assert load_run_config(None, ["algorithm.name=probe_plain"]).algorithm.estimator == "remax"


def test_settings_sections_and_the_cost_are_read_where_the_row_declares_them(tmp_path):
    module = _write_module(tmp_path / "readers.py", 'name="probe_dapo", estimators=("grpo",), min_samples=2, '
                           'settings="dapo", cost=True')
    dapo_setting = "algorithm.dapo.filter_groups.max_extra_rounds=2"
    with pytest.raises(ConfigError, match="probe_dapo needs a cost"):
        load_run_config(None, ["algorithm.name=probe_dapo", f"algorithm.module={module}", dapo_setting])
    cfg = load_run_config(None, ["algorithm.name=probe_dapo", f"algorithm.module={module}", dapo_setting,
                                 f"cost_model.custom_fn_path={tmp_path / 'cost.py'}"])
    assert cfg.algorithm.dapo.filter_groups.max_extra_rounds == 2
    with pytest.raises(ConfigError, match=r"algorithm.dapo.\* is read only by algorithm.name=dapo or probe_dapo "
                                          r"\(this run: grpo\)"):
        load_run_config(None, [dapo_setting])
    with pytest.raises(ConfigError, match=r"cost_model.\* is read only by algorithm.name=safe_rlhf or probe_dapo"):
        load_run_config(None, ["cost_model.path=/cost"])


@pytest.mark.parametrize("fields, message", [
    ({"estimators": ("nope",)}, r"nope"),
    ({"estimators": ()}, r"it declares no task kind"),
    ({"critics": ("value_model",)}, r"critics must be distinct roles from \['critic', 'cost_critic'\]"),
    ({"required": ("algorithm.lam",)}, r"required keys \['algorithm.lam'\] have no preset"),
    ({"settings": "my_section"}, r"settings='my_section' is not a settings section .* \['dapo', 'safe_rlhf'\]"),
    ({"min_samples": 0}, r"min_samples must be >= 1"),
    ({"program": "no path"}, r"must be a function or a 'module:function' path"),
    ({"name": "My-Algo"}, r"lowercase letters, digits and _"),
])
def test_a_bad_spec_says_which_field_is_wrong(fields, message):
    with pytest.raises(ValueError, match=message):
        AlgorithmSpec(**{"name": "probe_bad", "estimators": ("grpo",), **fields})


def test_a_name_is_registered_once_and_the_decorator_sets_the_program():
    with pytest.raises(ValueError, match=r"'grpo' is already registered with program "
                                         r"hybridflow.trainer.programs.algorithms:critic_free; choose another name"):
        register_algorithm(AlgorithmSpec("grpo", ("grpo",)))(_program)
    with pytest.raises(ValueError, match="leave program unset when decorating"):
        register_algorithm(AlgorithmSpec("probe_twice", ("grpo",), program="my_pkg.algo:step"))
    with pytest.raises(ValueError, match=r"has no program; decorate it"):
        add_algorithm(AlgorithmSpec("probe_none", ("grpo",)))
    assert register_algorithm(AlgorithmSpec("probe_once", ("grpo",), min_samples=2))(_program) is _program
    register_algorithm(AlgorithmSpec("probe_once", ("rloo",), min_samples=2))(_program)  # same program: replaced
    assert algorithm_registry.algorithm_spec("probe_once").estimators == ("rloo",)


@pytest.mark.parametrize("module, message", [
    ("no_such_dir/algo.py", r"algorithm.module: there is no such file as 'no_such_dir/algo.py'"),
    ("no_such_package_xyz.algo", r"algorithm.module: 'no_such_package_xyz.algo' cannot be imported"),
])
def test_a_module_that_cannot_be_found_is_a_config_error(module, message):
    with pytest.raises(ConfigError, match=message):
        load_run_config(None, [f"algorithm.module={module}"])


def test_an_import_error_inside_the_users_module_is_not_hidden(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import a_dependency_that_is_not_installed_xyz\n")
    with pytest.raises(ModuleNotFoundError, match="a_dependency_that_is_not_installed_xyz"):
        load_run_config(None, [f"algorithm.module={broken}"])
