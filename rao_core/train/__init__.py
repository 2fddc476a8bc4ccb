"""The RAO trainer: token-level policy-gradient loss, micro-batching, checkpoints.

Public API: :class:`TrainerConfig`, :class:`LoraSettings`, :func:`train` -> :class:`TrainResult`
(``rao_core.train.loss``: ``policy_loss``, ``token_logprobs``). The config imports without torch;
``train``/``TrainResult`` load torch on first access.
"""

from typing import Any

from rao_core.train.config import LoraSettings, TrainerConfig

__all__ = ["LoraSettings", "TrainerConfig", "TrainResult", "train"]


def __getattr__(name: str) -> Any:
    if name in ("train", "TrainResult"):
        from rao_core.train import trainer

        return getattr(trainer, name)
    raise AttributeError(f"module 'rao_core.train' has no attribute {name!r}")
