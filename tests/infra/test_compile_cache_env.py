"""The CPU policy server's AOT compile cache loads: vLLM loads the project's general plugin
(``infra/vllm_plugins/rao_vllm_compile.py``, entry point ``vllm.general_plugins`` ``rao_aot_cache``, found through
the ``PYTHONPATH`` every server gets), which gives torch's deserialised inductor function the ``finalize_loading``
vLLM calls on it. Before, every later start logged ``Compiling model again due to a load failure ... 'function'
object has no attribute 'finalize_loading'`` and compiled again (docs/benchmarks/generation.md "Compile cache")."""

from __future__ import annotations

import subprocess

import pytest

from rao_core.paths import vllm_python

CHECK = """
from importlib.metadata import entry_points
from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as Bundled

def plain(cls, data):  # what torch's deserialiser returns for the CPU engine's inductor artifact: a plain function
    return lambda *args: data

Bundled.deserialize_compile_artifacts = classmethod(plain)
(ep,) = [e for e in entry_points(group="vllm.general_plugins") if e.name == "rao_aot_cache"]
ep.load()()
ep.load()()  # loaded by each vLLM process, once or more: wrapped once
fn = Bundled.deserialize_compile_artifacts(b"artifact")
fn.finalize_loading(None)  # what vLLM calls after the load (vllm/compilation/decorators.py)
print(fn() == b"artifact", Bundled.deserialize_compile_artifacts.__func__.__closure__[0].cell_contents is plain)
"""


@pytest.mark.skipif(not vllm_python().exists(), reason="no vLLM environment (make setup)")
def test_vllm_finds_the_plugin_and_a_loaded_inductor_artifact_gets_finalize_loading():
    from infra.serving import VLLMServer

    env = VLLMServer("/nonexistent", on_gpu=False)._env()  # the servers' own PYTHONPATH
    out = subprocess.run([str(vllm_python()), "-c", CHECK], env={"PYTHONPATH": env["PYTHONPATH"], "PATH": "/usr/bin"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
