"""RAO core: the algorithm (rewards, advantages, loss, trainer), the recursive agent runtime and the
benchmark environments. No orchestration (Prefect), tracking (MLflow) or storage (boto3) imports here."""

__version__ = "0.1.0"
