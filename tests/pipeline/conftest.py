"""Fixtures shared by the pipeline tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def no_server(monkeypatch):
    """Any attempt to build a vLLM server fails the test (planning errors must come before any server)."""
    import infra.serving

    def refuse(*a, **k):
        raise AssertionError("a server was started")

    monkeypatch.setattr(infra.serving, "server_from_config", refuse)
