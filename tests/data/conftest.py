"""Fixtures for the data tests: the built-in character tokenizer, built once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def char_tokenizer():
    from hybridflow.data import build_char_tokenizer

    return build_char_tokenizer()
