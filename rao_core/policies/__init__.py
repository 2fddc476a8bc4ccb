"""Policies that drive nodes: the OpenAI-API endpoint client and scripted policies for tests/demos."""

from rao_core.policies.base import Generation, Policy, PolicyRequest

__all__ = ["Generation", "Policy", "PolicyRequest"]
