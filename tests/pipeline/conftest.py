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


@pytest.fixture
def progress_recorder():
    """A factory ``progress_recorder(made)`` of stand-ins for infra.stage_io.ProgressArtifact: the real class, every
    update written (no interval) to ``made[key]`` instead of Prefect: each count as ``(done, total)``, a ``note`` or
    ``finish`` as its text. Patch it in where a stage looks ProgressArtifact up."""
    from infra.stage_io import ProgressArtifact

    def make(made: dict[str, list]) -> type:
        class Recorder(ProgressArtifact):
            def __init__(self, key, description, **kw):
                super().__init__(key, description, min_interval_s=0.0, enabled=True)
                made[key] = []

            def _write(self, percent, text, now, sent):
                made[self.key].append(text if sent == (0, 0) else sent)
                self.artifact_id, self.sent = self.key, sent

        return Recorder

    return make
