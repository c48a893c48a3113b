"""Errors shared by every layer: `ConfigError`, the one type of a wrong config setting.

This module imports nothing from hybridflow, so any layer (algorithms, engines, workers,
config, trainer, cli) may raise it without breaking the layer order of ARCHITECTURE.md.

    raise ConfigError("must be >= 1, got 0", key="epochs")
    # a section that holds the raising config names the full key:
    raise err.within("actor.micro_batch")      # actor.micro_batch.epochs: must be >= 1, got 0
"""

from __future__ import annotations


class UserInputError(ValueError):
    """Something the user gave is wrong (config, model directory, data file, reward file,
    checkpoint): the message names it and the fix. The CLI prints it in one or two lines
    and exits with status 2 (no traceback unless --debug)."""

    MAX_CHARS = 2000  # a message quotes what the user gave, which may be huge or hold newlines

    def __str__(self) -> str:
        text = super().__str__()
        lines = text.splitlines()
        if len(lines) > 2:
            text = " ".join(line.strip() for line in lines)
        if len(text) <= self.MAX_CHARS:
            return text
        half = self.MAX_CHARS // 2  # the middle goes: a quoted value is there, the fix is at the end
        return f"{text[:half]} [... {len(text) - 2 * half} characters ...] {text[-half:]}"


class DamagedFileError(UserInputError):
    """A file a run reads back (a checkpoint's, a saved batch) is damaged, cut short or not
    what hybridflow wrote; the message names the file."""


class ConfigError(UserInputError):
    """A config setting is wrong: `key` (dotted, may be None) and what to change.

    A ValueError, so callers that catch ValueError keep working.
    """

    def __init__(self, message: str, key: str | None = None) -> None:
        self.message = message
        self.key = key
        super().__init__(f"{key}: {message}" if key else message)

    def within(self, section: str) -> ConfigError:
        """The same error with `key` placed under `section` (e.g. "actor")."""
        if not section:
            return self
        return ConfigError(self.message, f"{section}.{self.key}" if self.key else section)

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str, str | None]]:
        # Keeps key and message apart when the error crosses a process boundary (Ray).
        return type(self), (self.message, self.key)
