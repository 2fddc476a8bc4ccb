"""Calibration: measure the LLM judge against an exact verifier.

TextCraft-Synth sub-tasks are exactly checkable, so on TextCraft trees every node has a verifier value
(``node.verifier``). ``calibrate`` sends each such node to the judge as if no verifier existed (same
prompt rendering, cache, budget and retries as ``judge_trees``) and compares: truth = verifier value
>= 0.5 ("positive" = the sub-task was accomplished), prediction = verdict "yes".

Reported: n (nodes with both a truth and a parsed verdict), accuracy = (TP + TN) / n,
false-positive rate = FP / (FP + TN) (judge says yes, verifier says no), false-negative rate =
FN / (FN + TP), the confusion counts, the judge failures (NaN; excluded from n), and the nodes settled by
the unfinished-node rule without a request (excluded from n, since they measure the rule, not the judge).
Rates whose denominator is 0 are NaN.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Sequence

import openai
from pydantic import BaseModel, Field

from rao_core.judge.budget import JudgeStats
from rao_core.judge.client import Judger
from rao_core.judge.config import JudgeConfig
from rao_core.judge.prompting import load_prompt
from rao_core.judge.stage import judge_inputs
from rao_core.tree import EndReason, ExecutionTree, verifier_value


class Confusion(BaseModel):
    """Confusion counts of judge verdicts against the verifier, and the derived rates."""

    tp: int = 0
    fp: int = 0
    tn: int = 0
    fn: int = 0

    @property
    def n(self) -> int:
        """Nodes with both a truth and a verdict."""
        return self.tp + self.fp + self.tn + self.fn

    @property
    def accuracy(self) -> float:
        """(TP + TN) / n, NaN when n = 0."""
        return (self.tp + self.tn) / self.n if self.n else math.nan

    @property
    def false_positive_rate(self) -> float:
        """FP / (FP + TN): share of failed sub-tasks the judge called a success; NaN without negatives."""
        return self.fp / (self.fp + self.tn) if self.fp + self.tn else math.nan

    @property
    def false_negative_rate(self) -> float:
        """FN / (FN + TP): share of accomplished sub-tasks the judge called a failure; NaN without positives."""
        return self.fn / (self.fn + self.tp) if self.fn + self.tp else math.nan

    def add(self, truth: bool, pred: bool) -> None:
        """Count one (truth, prediction) pair."""
        if truth and pred:
            self.tp += 1
        elif truth:
            self.fn += 1
        elif pred:
            self.fp += 1
        else:
            self.tn += 1


class CalibrationReport(BaseModel):
    """Agreement of the judge with the exact verifier, overall, by depth and roots vs sub-agents."""

    env: str
    model: str
    prompt_version: str
    overall: Confusion = Field(default_factory=Confusion)
    by_depth: dict[int, Confusion] = Field(default_factory=dict)
    nodes_with_truth: int = 0
    failures: int = 0
    unfinished_rule: int = 0
    stats: JudgeStats = Field(default_factory=JudgeStats)


async def calibrate(trees: Sequence[ExecutionTree], config: JudgeConfig, *, env_name: str = "textcraft-synth",
                    client: openai.AsyncOpenAI | None = None) -> CalibrationReport:
    """Judge every node of ``trees`` that has a verifier value and compare (see module docstring).

    Trees are not modified. Raises ValueError when no node has a verifier value (nothing to calibrate
    on), ``JudgeEndpointError`` when the endpoint rejects the configuration.
    """
    t0 = time.monotonic()
    prompt = load_prompt(env_name, config.prompt_dir)
    stats = JudgeStats()
    report = CalibrationReport(env=env_name, model=config.model, prompt_version=prompt.version)
    items = []
    for tree in trees:
        for node in tree.walk():
            stats.nodes += 1
            v = verifier_value(node)
            if v is None:
                continue
            report.nodes_with_truth += 1
            if config.unfinished_is_failure and node.end_reason != EndReason.FINISHED:
                report.unfinished_rule += 1
                continue
            items.append((node, v >= 0.5))
    if report.nodes_with_truth == 0:
        raise ValueError("no node in the given trees has a verifier value: nothing to calibrate on "
                         "(calibration needs trees from an environment with exact sub-task verification)")
    judger = Judger(config, stats, client=client)
    try:
        tasks = []
        for node, _ in items:
            messages, goal, result, cells = judge_inputs(node, prompt, config)
            tasks.append(judger.judge(messages, prompt_version=prompt.version, goal=goal, result=result,
                                      cells=cells))
        outcomes = await asyncio.gather(*tasks)
    finally:
        await judger.aclose()
    for (node, truth), out in zip(items, outcomes, strict=True):
        if out.status != "ok":
            report.failures += 1
            continue
        pred = out.verdict == "yes"
        report.overall.add(truth, pred)
        report.by_depth.setdefault(node.depth, Confusion()).add(truth, pred)
    stats.wall_s = time.monotonic() - t0
    report.stats = stats
    return report


def calibrate_sync(trees: Sequence[ExecutionTree], config: JudgeConfig, *, env_name: str = "textcraft-synth",
                   client: openai.AsyncOpenAI | None = None) -> CalibrationReport:
    """Blocking wrapper of ``calibrate``."""
    return asyncio.run(calibrate(trees, config, env_name=env_name, client=client))
