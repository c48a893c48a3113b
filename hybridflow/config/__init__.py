"""Typed configuration: dataclass trees loaded from YAML with dotted overrides.

`ConfigError` (hybridflow/errors.py) is the one error type of a wrong setting, raised by
every layer's config classes and re-exported here.
"""

from hybridflow.config.loader import ConfigError, config_to_dict, load_config, save_config

__all__ = ["ConfigError", "config_to_dict", "load_config", "save_config"]
