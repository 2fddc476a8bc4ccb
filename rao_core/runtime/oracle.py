"""Lookup of the gold-path scripted ("oracle") policy of each environment, imported lazily by name."""

from __future__ import annotations

import importlib

from rao_core.policies.base import Policy

ORACLE_POLICIES: dict[str, str] = {
    "textcraft-synth": "rao_core.policies.textcraft_expert:TextCraftExpert",
    "deepdive": "rao_core.policies.deepdive_expert:DeepDiveExpert",
    "deepdive-synth": "rao_core.policies.deepdive_expert:DeepDiveExpert",
    "arte": "rao_core.policies.arte_expert:ArteExpert",
    "arte-synth": "rao_core.policies.arte_expert:ArteExpert",
}


def oracle_policy(env_name: str) -> Policy:
    """A new instance of ``env_name``'s expert policy (no-arg constructor).

    Raises ValueError for an environment without one, ImportError when its module is not available.
    """
    try:
        target = ORACLE_POLICIES[env_name]
    except KeyError:
        raise ValueError(f"no oracle policy for environment {env_name!r}; known: {sorted(ORACLE_POLICIES)}") \
            from None
    module, cls = target.split(":")
    return getattr(importlib.import_module(module), cls)()
