"""Shared fixtures of the training unit tests."""

from __future__ import annotations

import pytest

from tests.tiny import tiny_config


@pytest.fixture
def make_config():
    return tiny_config
