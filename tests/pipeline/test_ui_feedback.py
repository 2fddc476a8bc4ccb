"""What the user sees of a running campaign (issue 17): one artifact-key pattern, progress artifacts in the
Prefect UI, no vLLM server left behind by a cancelled or crashed flow, and the campaign form's name."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize("campaign, stage, iteration, key", [
    ("smoke", "validation", 1, "smoke-iter-1-validation"),
    ("smoke", "eval", 0, "smoke-iter-0-eval"),
    ("My_Campaign.v2", "eval", 3, "my-campaign-v2-iter-3-eval"),
    ("__Odd..Name__", "generate progress", 12, "odd-name-iter-12-generate-progress"),
    ("nightly", "comparison", None, "nightly-comparison"),
    ("smoke", "warm_start", "iter-0", "smoke-iter-0-warm-start"),
])
def test_artifact_keys_follow_one_pattern_prefect_accepts(campaign, stage, iteration, key):
    from prefect.client.schemas.actions import ArtifactCreate
    from prefect.types.names import raise_on_name_alphanumeric_dashes_only

    from tasks.common import artifact_key

    got = artifact_key(campaign, stage, iteration)
    assert got == key
    assert raise_on_name_alphanumeric_dashes_only(got) == got  # Prefect's own rule for artifact keys
    assert ArtifactCreate(key=got, type="markdown", data="x").key == got


def test_artifact_key_refuses_an_empty_name():
    from tasks.common import artifact_key

    with pytest.raises(ValueError, match="campaign and a stage"):
        artifact_key("__", "eval", 1)


def test_every_stage_artifact_uses_artifact_key():
    """No artifact key is spelled by hand any more (the three shapes of issue 17, item 7)."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    calls = []
    for path in [*root.glob("tasks/*.py"), *root.glob("flows/*.py")]:
        calls += [(path.name, m.group(1)) for m in re.finditer(r"create_\w+_artifact\((?:\s*\w+=[^,]+,)*?\s*key=([^,]+),",
                                                                   path.read_text())]
    assert calls, "no artifact call found: the pattern of this test is stale"
    assert all(arg.startswith("artifact_key(") for _, arg in calls), calls
