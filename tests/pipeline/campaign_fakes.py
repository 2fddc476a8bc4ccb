"""Fakes shared by the campaign-loop tests (the collapse guard, ``eval.every``): an in-memory artifact store and
evaluation records built from per-task outcomes."""

from __future__ import annotations

from infra.stage_records import EvalOutput


class MemoryStore:
    """The calls of ``infra.storage.ArtifactStore`` the campaign makes here, on a dict."""

    def __init__(self, prefix: str):
        self.prefix, self.objects = prefix, {}

    def uri(self, key: str) -> str:
        return f"s3://rao/{self.prefix}/{key}"

    def exists(self, key: str) -> bool:
        return key in self.objects

    def put_bytes(self, data: bytes, key: str) -> dict:
        self.objects[key] = data
        return {"uri": self.uri(key), "size": len(data)}

    def get_bytes(self, key: str) -> bytes:
        return self.objects[key]

    def list(self, key_prefix: str = "") -> list[str]:
        return sorted(k for k in self.objects if k.startswith(key_prefix))


def eval_row(difficulty: str, outcomes: list[int]) -> dict:
    """A recursive-mode evaluation row of ``difficulty``: task ``<difficulty>-<i>`` has outcome ``outcomes[i]``."""
    s = sum(outcomes)
    return {"mode": "recursive", "difficulty": difficulty, "n": len(outcomes), "successes": s,
            "success": s / len(outcomes), "ci95": "[0.00, 1.00]",
            "per_task": {f"{difficulty}-{i}": v for i, v in enumerate(outcomes)}}


def eval_output(rows: list[dict]) -> EvalOutput:
    """The evaluate stage's record of ``rows``: each row's success as ``eval/recursive/<difficulty>/success``."""
    return EvalOutput(metrics={f"eval/recursive/{r['difficulty']}/success": r["success"] for r in rows}, rows=rows)
