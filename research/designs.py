"""The experiment designs: the arms of ``rao experiment`` and how each differs from the campaign config.

An arm is one campaign run from the experiment's config with the overrides of :func:`arm_overrides`; it is
evaluated in its own mode (:data:`ARM_MODES`), and :data:`ARM_PAIRS` are the comparisons made when both arms
ran. An experiment run as units (``research.units``) has a :class:`UnitDesign`: its arms, or named config
variants of one arm (a sweep). Docs: docs/experiments.md.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass, field

#: The evaluation mode of each arm of ``rao experiment`` (:func:`arm_overrides`).
ARM_MODES = {"recursive": "recursive", "outcome": "recursive", "single": "single"}
#: Arm comparisons made when both arms ran: (arm, against), H1: arm > against.
ARM_PAIRS = (("recursive", "single"), ("recursive", "outcome"), ("outcome", "single"))


def arm_overrides(arm: str, overrides: list[str], registered_model: str, shared_checkpoint: str | None,
                  single_max_steps: int | None = None) -> list[str]:
    """Config overrides (``KEY=VALUE``) of one arm, after the user's ``overrides``.

    ``single``: delegation off, single-mode evaluation, its own registered model (the arm's campaign name
    fills ``{campaign}``; a fixed name gets ``-single``), so its champion never moves the recursive agent's.
    With ``single_max_steps`` the single arm's node may take that many steps (``runtime.max_steps_per_node``).
    ``recursive``: recursive-mode evaluation (RAO as configured). ``outcome``: the ablation of RAO's credit
    assignment: recursive, but every node's success is its root's (``judge.child_source:
    root_proxy``), no delegation bonus (``algo.lam: 0``) and no depth weights, so every node of a tree gets the
    root's outcome and one advantage; what peers ship (SkyRL's recursive-LM recipe) and what RAO must beat. With ``shared_checkpoint`` (the first arm's iteration-0
    folder) the arm starts from it instead of building its own warm start. A ``name=...`` override is
    dropped: it is the prefix of the arms' campaign names (``<name>-<arm>``), and kept it would give both
    arms one campaign (the second would resume the first). Raises ValueError for another arm name.
    """
    extra = [o for o in overrides if o.partition("=")[0].strip() != "name"]
    if arm == "single":
        extra += ["runtime.delegation=false", "eval.modes=[single]"]
        extra += [] if "{campaign}" in registered_model else [f"model.registered_model={registered_model}-single"]
        extra += [f"runtime.max_steps_per_node={single_max_steps}"] if single_max_steps else []
    elif arm == "recursive":
        extra += ["eval.modes=[recursive]"]
    elif arm == "outcome":
        extra += ["eval.modes=[recursive]", "judge.child_source=root_proxy", "algo.lam=0", "algo.depth_weights=false"]
        extra += [] if "{campaign}" in registered_model else [f"model.registered_model={registered_model}-outcome"]
    else:
        raise ValueError(f"unknown arm {arm!r} (expected 'recursive', 'outcome' or 'single')")
    if shared_checkpoint:
        extra += ["warm_start.mode=checkpoint", f"warm_start.checkpoint={shared_checkpoint}"]
    return extra


def git_output(*args: str) -> str | None:
    """``git ARGS`` output, stripped; None when git fails (no repository, a file outside it)."""
    p = subprocess.run(["git", *args], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else None


#: A variant's name (:attr:`UnitDesign.variants`): lower-case letters, digits, '.' and '-', starting with a letter
#: or digit; its units are ``<variant>-seed<S>`` and their campaigns ``<experiment>-<variant>-seed<S>-<stamp>``.
VARIANT_NAME_PATTERN = r"^[a-z0-9][a-z0-9.-]*$"


@dataclass(frozen=True)
class UnitDesign:
    """An experiment as units (``research.units``): its arms (or config variants of one arm), seeds and warm starts.

    ``arms`` in order (each an :func:`arm_overrides` arm); ``seeds`` (empty: the config's seed); ``single_warm_start``
    ``own``: the single arm starts from its own warm start (single-agent demonstrations), ``shared``: from the
    recursive one; ``warm_overrides``: per warm-start kind (``recursive``, ``single``), ``KEY=VALUE`` overrides of
    its recipe (e.g. its SFT epochs); ``depth_control``: the arms whose unit also evaluates its last checkpoint on
    ``control_difficulty`` with ``runtime.max_depth`` 1 (the depth-limited control: the checkpoint does not outlive
    the unit's machine). The RL iterations of an arm unit are the config's ``iterations``.

    ``variants`` (a sweep): variant name -> its ``KEY=VALUE`` overrides (e.g. ``{"lr1e-5-mb1": ("trainer.lr=1e-5",
    "trainer.steps_per_batch=1")}``), applied to the one arm of ``arms`` after the command's own ``--set``
    overrides and the arm's; the units are then ``<variant>-seed<S>`` in the order given, all from the arm's one warm
    start (instead of ``<arm>-seed<S>``). ``eval_on_training``: the evaluation set is drawn from the TRAINING split
    (the config's ``eval.split`` must be ``train``), every problem of the RL task pool and of the demonstrations of
    every unit skipped (``rao_core.task_sets.evaluation_tasks``): training-split problems the runs never train on,
    for a design decision (a sweep), not a held-out evaluation.

    Raises ValueError for variants with more or fewer than one arm, a variant name outside
    :data:`VARIANT_NAME_PATTERN` (or one starting ``warm-``), an override that is not ``KEY=VALUE``, or
    ``eval_on_training`` with a depth-limited control."""

    arms: tuple[str, ...] = ("recursive", "single")
    seeds: tuple[int, ...] = ()
    single_warm_start: str = "shared"
    warm_overrides: dict[str, tuple[str, ...]] = field(default_factory=dict)
    depth_control: tuple[str, ...] = ()
    control_difficulty: str = "nest2"
    variants: dict[str, tuple[str, ...]] = field(default_factory=dict)
    eval_on_training: bool = False

    def __post_init__(self) -> None:
        if self.eval_on_training and self.depth_control:
            raise ValueError("a design that evaluates training-split problems (eval_on_training) has no depth-limited "
                             "control (its tasks would not skip the training problems)")
        if not self.variants:
            return
        if len(self.arms) != 1:
            raise ValueError(f"a design with variants has one arm (its units are <variant>-seed<S>), got {self.arms}")
        for name, overrides in self.variants.items():
            if not re.fullmatch(VARIANT_NAME_PATTERN, name) or name.startswith("warm-"):
                raise ValueError(f"variant {name!r}: not a variant name (lower-case letters, digits, '.' and '-', "
                                 "starting with a letter or digit, not 'warm-')")
            bad = [o for o in overrides if "=" not in o or not o.partition("=")[0].strip()]
            if bad:
                raise ValueError(f"variant {name!r}: override {bad[0]!r} is not KEY=VALUE")


#: The unit designs of the experiments that have one; another experiment gets ``UnitDesign()`` with the arms and
#: seeds its command names (:func:`unit_design`).
UNIT_DESIGNS: dict[str, UnitDesign] = {
    # docs/experiments/textcraft-deeper.md "Units": 3 arms x 3 seeds from two warm starts; the single agent's
    # own recipe is 20 single-agent demonstrations x 4 SFT epochs (chosen on the training-split probe)
    "textcraft-deeper": UnitDesign(arms=("recursive", "outcome", "single"), seeds=(0, 1, 2), single_warm_start="own",
                                   warm_overrides={"single": ("warm_start.trainer.epochs=4",)},
                                   depth_control=("recursive",)),
    # docs/experiments/update-sweep.md (preregistered): lr x minibatches per batch, the 4-minibatch ones with the
    # approximate-KL stop; one seed, one shared warm start; evaluated on training-split problems no unit trains on
    "update-sweep": UnitDesign(arms=("recursive",), seeds=(0,), eval_on_training=True, variants={
        "lr1e-5-mb1": ("trainer.lr=1.0e-5", "trainer.steps_per_batch=1"),
        "lr3e-5-mb1": ("trainer.lr=3.0e-5", "trainer.steps_per_batch=1"),
        "lr1e-4-mb1": ("trainer.lr=1.0e-4", "trainer.steps_per_batch=1"),
        "lr1e-5-mb4": ("trainer.lr=1.0e-5", "trainer.steps_per_batch=4", "trainer.target_kl=0.02"),
        "lr3e-5-mb4": ("trainer.lr=3.0e-5", "trainer.steps_per_batch=4", "trainer.target_kl=0.02"),
        "lr1e-4-mb4": ("trainer.lr=1.0e-4", "trainer.steps_per_batch=4", "trainer.target_kl=0.02"),
    }),
}


def unit_design(experiment: str, arms: list[str] | None = None, seeds: list[int] | None = None) -> UnitDesign:
    """The unit design of ``experiment``: its entry of :data:`UNIT_DESIGNS` (fixed: the units a status counts
    never change with a command's options), else a design of ``arms`` (default recursive and single) and ``seeds``
    (default: the config's) sharing one warm start. Raises ValueError for an unknown arm."""
    if experiment in UNIT_DESIGNS:
        return UNIT_DESIGNS[experiment]
    arms = list(arms or ("recursive", "single"))
    for a in arms:
        if a not in ARM_MODES:
            raise ValueError(f"unknown arm {a!r} (expected 'recursive', 'outcome' or 'single')")
    return UnitDesign(arms=tuple(dict.fromkeys(arms)), seeds=tuple(dict.fromkeys(seeds or ())))
