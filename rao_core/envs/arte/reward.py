"""ART-E rewards: the graded ladder of the reference and the plain 0/1 variant, as pure functions.

Ladder (after the ART-E reference ``calculate_reward``; weights are ``ArteRewardConfig`` fields):

    partial = found * w_found + read * w_read + (not invalid_read) * w_no_invalid + sources_ok * w_sources
    format error (finished without an answer string)   ->  r_format + partial        (default -2 + partial)
    wrong answer                                        ->  r_wrong + partial         (default -1 + partial)
    "I don't know" or ran out of turns / other end      ->  r_abstain + partial       (default  0 + partial)
    correct answer                                      ->  r_correct + sources_ok * b_sources
                                                           + b_few_sources / num_sources   (if num_sources > 0)
                                                           + b_turns * (1 - num_turns / max_turns)

Partial credits sum to at most 0.4 (< the 1.0 gap between rungs), so rungs never overlap. The binary
variant is ``1.0`` for a correct answer else ``0.0``. ``ladder_success`` maps the ladder affinely onto
[0, 1] with the ladder's own bounds, because a node's success s of Eq. (1) lives in [0, 1]; the raw ladder
value is kept in the breakdown for logging. Abstention strings: "I don't know" after normalisation
(also "i do not know", "idk", "unknown").
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from rao_core.envs.deepdive.scoring import normalize_answer

ABSTENTIONS = frozenset({"i dont know", "i do not know", "idk", "unknown"})


def is_abstention(answer: str) -> bool:
    """True for "I don't know" and its variants (after ``normalize_answer``)."""
    return normalize_answer(answer) in ABSTENTIONS


class ArteRewardConfig(BaseModel):
    """Weights of the ART-E reward ladder (defaults: the reference's values)."""

    model_config = ConfigDict(extra="forbid")

    r_correct: float = Field(1.0, description="Base reward of a correct answer.")
    b_sources: float = Field(0.3, ge=0, description="Bonus when the sources include a gold message id.")
    b_few_sources: float = Field(0.1, ge=0, description="Bonus divided by the number of sources given.")
    b_turns: float = Field(0.1, ge=0, description="Bonus times (1 - turns used / max turns).")
    r_wrong: float = Field(-1.0, description="Base reward of a wrong (non-abstaining) answer.")
    r_abstain: float = Field(0.0, description="Base reward of 'I don't know' or running out of turns.")
    r_format: float = Field(-2.0, description="Base reward of finishing without a usable answer.")
    w_found: float = Field(0.1, ge=0, description="Partial credit: a search ever returned a gold email.")
    w_read: float = Field(0.1, ge=0, description="Partial credit: read_email was called on a gold email.")
    w_no_invalid: float = Field(0.1, ge=0, description="Partial credit: never read a non-existent email.")
    w_sources: float = Field(0.1, ge=0, description="Partial credit: the sources include a gold email.")

    def bounds(self) -> tuple[float, float]:
        """(lowest, highest) ladder value reachable with these weights."""
        partial_max = self.w_found + self.w_read + self.w_no_invalid + self.w_sources
        lo = min(self.r_format, self.r_wrong, self.r_abstain)
        hi = max(self.r_correct + self.b_sources + self.b_few_sources + self.b_turns,
                 max(self.r_format, self.r_wrong, self.r_abstain) + partial_max)
        return lo, hi


class ArteRubric(BaseModel):
    """What happened in one rollout, as the ladder needs it."""

    answer_correct: bool
    attempted_answer: bool  # finished with a non-abstaining answer string
    abstained: bool  # finished with "I don't know"
    ran_out_of_turns: bool  # the node did not finish (any limit or failure)
    format_error: bool  # finished, but the result has no answer string
    ever_found_right_email: bool
    ever_read_right_email: bool
    ever_tried_to_read_invalid_email: bool
    sources_correct: bool
    num_sources: int = Field(ge=0)
    num_turns: int = Field(ge=0)
    max_turns: int = Field(ge=1)


class ArteReward(BaseModel):
    """A reward with its named parts: ``value`` (raw ladder or 0/1), ``success`` in [0, 1], ``parts``."""

    value: float
    success: float
    parts: dict[str, float]
    rung: str  # "correct" | "wrong" | "abstain" | "format"


def binary_reward(rubric: ArteRubric) -> ArteReward:
    """1.0 for a correct answer, else 0.0."""
    v = 1.0 if rubric.answer_correct and rubric.attempted_answer else 0.0
    return ArteReward(value=v, success=v, parts={"correct": v}, rung="correct" if v else "other")


def ladder_reward(rubric: ArteRubric, cfg: ArteRewardConfig | None = None) -> ArteReward:
    """The graded ladder of the module docstring; ``success`` = (value - lo) / (hi - lo) of ``cfg.bounds()``."""
    cfg = cfg or ArteRewardConfig()
    partial = {
        "found": cfg.w_found * rubric.ever_found_right_email,
        "read": cfg.w_read * rubric.ever_read_right_email,
        "no_invalid_read": cfg.w_no_invalid * (not rubric.ever_tried_to_read_invalid_email),
        "sources_partial": cfg.w_sources * rubric.sources_correct,
    }
    if rubric.format_error:
        rung, parts = "format", {"base": cfg.r_format, **partial}
    elif rubric.attempted_answer and not rubric.answer_correct:
        rung, parts = "wrong", {"base": cfg.r_wrong, **partial}
    elif rubric.abstained or rubric.ran_out_of_turns or not rubric.attempted_answer:
        rung, parts = "abstain", {"base": cfg.r_abstain, **partial}
    else:
        rung = "correct"
        parts = {
            "base": cfg.r_correct,
            "sources": cfg.b_sources * rubric.sources_correct,
            "few_sources": cfg.b_few_sources / rubric.num_sources if rubric.num_sources > 0 else 0.0,
            "turns": cfg.b_turns * (1.0 - min(rubric.num_turns, rubric.max_turns) / rubric.max_turns),
        }
    value = float(sum(parts.values()))
    lo, hi = cfg.bounds()
    success = min(1.0, max(0.0, (value - lo) / (hi - lo))) if hi > lo else float(value > lo)
    return ArteReward(value=value, success=success, parts={k: float(v) for k, v in parts.items()}, rung=rung)
