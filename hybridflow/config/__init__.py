"""Typed configuration: dataclass trees loaded from YAML with dotted overrides."""

from hybridflow.config.loader import ConfigError, config_to_dict, load_config, save_config

__all__ = ["ConfigError", "config_to_dict", "load_config", "save_config"]
