"""The judging stage: success signals s(X, tau_X) of Eq. (1) for every node of an execution tree.

Sources per node: exact verifier, LLM judge (OpenAI API, any endpoint), or the paper's root proxy;
see ``rao_core.judge.stage`` for the rules and ``docs/judging.md`` for the user guide.

Public API::

    config = JudgeConfig(base_url="http://127.0.0.1:8000/v1", model="judge")
    scored, stats = await judge_trees(trees, "oolong", config)        # or judge_trees_sync(...)
    report = await calibrate(textcraft_trees, config)                  # judge vs exact verifier
"""

from rao_core.judge.budget import JudgeStats
from rao_core.judge.calibration import CalibrationReport, Confusion, calibrate, calibrate_sync
from rao_core.judge.client import JudgeEndpointError, JudgeOutcome
from rao_core.judge.config import JudgeConfig
from rao_core.judge.parsing import ParsedVerdict, parse_verdict
from rao_core.judge.prompting import JudgePrompt, PromptError, load_prompt
from rao_core.judge.stage import judge_trees, judge_trees_sync
from rao_core.tree import verifier_value

__all__ = [
    "CalibrationReport", "Confusion", "JudgeConfig", "JudgeEndpointError", "JudgeOutcome", "JudgePrompt",
    "JudgeStats", "ParsedVerdict", "PromptError", "calibrate", "calibrate_sync", "judge_trees",
    "judge_trees_sync", "load_prompt", "parse_verdict", "verifier_value",
]
