"""Config loading: YAML + dotted overrides into typed dataclasses, with clear errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import pytest
import yaml

from hybridflow.config import ConfigError, config_to_dict, load_config, save_config
from hybridflow.config.loader import user_tree


@dataclass
class Optim:
    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    schedule: Literal["constant", "cosine"] = "constant"

    def __post_init__(self) -> None:
        if self.lr <= 0:
            raise ConfigError(f"must be > 0, got {self.lr}", "lr")  # keyed relative to this class


@dataclass
class Actor:
    optim: Optim = field(default_factory=Optim)
    micro_batch_size: int = 4
    use_lora: bool = False
    model_path: str | None = None
    kwargs: dict = field(default_factory=dict)
    activation: Literal["tanh", "relu"] | None = None

    def __post_init__(self) -> None:
        if self.micro_batch_size < 1:
            raise ValueError(f"micro_batch_size must be >= 1, got {self.micro_batch_size}")


@dataclass
class Root:
    actor: Actor = field(default_factory=Actor)
    seed: int = 0
    tags: list[str] = field(default_factory=list)


def test_defaults_yaml_then_overrides_in_order(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"seed": 3, "actor": {"optim": {"lr": 2e-5}}}))
    cfg = load_config(Root, path, ["actor.optim.lr=3e-5", "actor.micro_batch_size=8", "seed=5"])
    assert cfg.seed == 5
    assert cfg.actor.optim.lr == pytest.approx(3e-5)
    assert cfg.actor.micro_batch_size == 8
    assert cfg.actor.optim.betas == (0.9, 0.999)  # untouched default


def test_value_types_are_converted_and_checked():
    cfg = load_config(Root, None, ["actor.optim.lr=1", "actor.optim.betas=[0.8, 0.95]",
                                   "tags=[a, b]", "actor.model_path=null", "actor.use_lora=true"])
    assert isinstance(cfg.actor.optim.lr, float) and cfg.actor.optim.lr == 1.0
    assert cfg.actor.optim.betas == (0.8, 0.95)
    assert cfg.tags == ["a", "b"] and cfg.actor.model_path is None and cfg.actor.use_lora is True
    with pytest.raises(ConfigError, match="actor.micro_batch_size: expected int"):
        load_config(Root, None, ["actor.micro_batch_size=four"])
    # A whole number in float notation (1e5 steps, as train(steps=1e5) takes it) is an int; 2.5 is not.
    assert load_config(Root, None, ["seed=1e5"]).seed == 100_000 and load_config(Root, None, ["seed=8.0"]).seed == 8
    with pytest.raises(ConfigError, match="seed: expected int, got 2.5"):
        load_config(Root, None, ["seed=2.5"])
    with pytest.raises(ConfigError, match="actor.use_lora: expected true/false"):
        load_config(Root, None, ["actor.use_lora=3"])
    with pytest.raises(ConfigError, match="not one of"):
        load_config(Root, None, ["actor.optim.schedule=linear"])
    assert load_config(Root, None, ["actor.optim.schedule=Cosine"]).actor.optim.schedule == "cosine"  # any case


def test_a_bare_dict_field_and_an_optional_choice_are_checked_in_plain_words():
    assert load_config(Root, None, ["actor.kwargs={a: 1}"]).actor.kwargs == {"a": 1}
    with pytest.raises(ConfigError, match=r"^actor.kwargs: expected a mapping, got 3$"):
        load_config(Root, None, ["actor.kwargs=3"])  # was accepted as 3
    with pytest.raises(ConfigError, match=r"^actor.activation: 'tan' is not one of \['tanh', 'relu'\] \(or null\)$"):
        load_config(Root, None, ["actor.activation=tan"])  # was "matches none of typing.Optional[...]"


def test_unknown_key_names_the_closest_valid_key():
    with pytest.raises(ConfigError, match=r"^actor.optim.lrr: unknown config key; did you mean 'lr'") as err:
        load_config(Root, None, ["actor.optim.lrr=1e-5"])
    assert err.value.key == "actor.optim.lrr"
    with pytest.raises(ConfigError, match=r"^actr: unknown config key; did you mean 'actor'"):
        load_config(Root, None, ["actr.micro_batch_size=2"])


def test_section_validation_error_names_the_section():
    # A plain ValueError of a section names the section ...
    with pytest.raises(ConfigError, match=r"^actor: invalid section \(Actor\): micro_batch_size must be >= 1") as err:
        load_config(Root, None, ["actor.micro_batch_size=0"])
    assert err.value.key == "actor"
    # ... and a ConfigError keyed relative to its class comes out keyed from the root.
    with pytest.raises(ConfigError, match=r"^actor.optim.lr: must be > 0, got -1") as err:
        load_config(Root, None, ["actor.optim.lr=-1"])
    assert err.value.key == "actor.optim.lr"


def test_user_tree_is_the_file_with_the_overrides_applied(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"seed": 3, "actor": {"optim": {"lr": 2e-5}}}))
    assert user_tree(path, ["actor.use_lora=true", "seed=4"]) == {
        "seed": 4, "actor": {"optim": {"lr": 2e-5}, "use_lora": True}}


def test_malformed_overrides_and_files(tmp_path):
    with pytest.raises(ConfigError, match="key.path=value"):
        load_config(Root, None, ["seed"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(Root, tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="mapping at the top level"):
        load_config(Root, bad)
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config(Root, None, ["seed=1", "seed.x=2"])


def test_save_round_trip(tmp_path):
    cfg = load_config(Root, None, ["actor.optim.lr=4e-5", "tags=[x]"])
    out = save_config(cfg, tmp_path / "config.yaml")
    assert load_config(Root, out) == cfg
    assert config_to_dict(cfg)["actor"]["optim"]["betas"] == [0.9, 0.999]
    assert not (tmp_path / "config.yaml.tmp").exists()


@dataclass
class Tuned:
    """A tree whose section default differs from the section class's own defaults."""

    actor: Actor = field(default_factory=lambda: Actor(optim=Optim(lr=3e-4), micro_batch_size=8))
    maybe: Optim | None = None


def test_partial_section_keeps_the_tree_default_of_the_other_keys():
    cfg = load_config(Tuned, None, ["actor.optim.schedule=cosine"])
    assert cfg.actor.optim.lr == pytest.approx(3e-4)  # not Optim's class default 1e-6
    assert cfg.actor.micro_batch_size == 8 and cfg.actor.optim.schedule == "cosine"
    assert load_config(Tuned, None, ["actor.micro_batch_size=2"]).actor.optim.lr == pytest.approx(3e-4)
    # A section that was None by default is built from its class defaults.
    assert load_config(Tuned, None, ["maybe.lr=2e-5"]).maybe == Optim(lr=2e-5)
    assert Tuned().actor.optim.lr == pytest.approx(3e-4)  # the default instance is not mutated
