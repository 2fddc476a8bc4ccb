"""Fixtures of the environment tests: a temporary RAO_HOME for generated corpora (DeepDive, ART-E)."""

import os

import pytest


@pytest.fixture(scope="module")
def rao_home(tmp_path_factory):
    """Generated corpora (DeepDive, ART-E) go to a temporary RAO_HOME for the module's tests."""
    old = os.environ.get("RAO_HOME")
    os.environ["RAO_HOME"] = str(tmp_path_factory.mktemp("rao_home"))
    yield
    if old is None:
        os.environ.pop("RAO_HOME", None)
    else:
        os.environ["RAO_HOME"] = old
