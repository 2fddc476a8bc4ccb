"""The record of the services ``rao services up`` started: ``$RAO_HOME/services/state.json``.

One entry per service name: pid, url, log, when it started, and the variables that point a process at the
service, credentials included; the file is therefore written mode 0600 (:func:`infra.credentials.write_private`).
Both the services' commands (``infra.services``) and the clients that look a service up (``infra.orchestration``)
read it here.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from infra.credentials import write_private
from rao_core.paths import rao_home


def state_path() -> Path:
    """``$RAO_HOME/services/state.json``."""
    return rao_home() / "services" / "state.json"


def load_state() -> dict[str, dict[str, Any]]:
    """The recorded services (empty when none is recorded or the file is unreadable JSON)."""
    try:
        return json.loads(state_path().read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def save_state(state: dict[str, dict[str, Any]]) -> None:
    """Write the state file (mode 0600: it holds the services' credentials)."""
    write_private(state_path(), json.dumps(state, indent=2))


def record(name: str, **info: Any) -> None:
    """Record service ``name`` with ``info`` and the time it started."""
    state = load_state()
    state[name] = {**info, "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    save_state(state)
