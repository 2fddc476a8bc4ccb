"""``rao train`` end to end on the tiny model (samples file -> checkpoint folder)."""

import json

import pytest
from typer.testing import CliRunner

from rao_core.paths import tiny_model_path
from rao_core.samples import Sample, write_samples


@pytest.mark.parametrize("section", ["trainer", "train"])
def test_rao_train_cli(tmp_path, section):
    """A campaign config's `trainer:` section is read (and the older `train:` key)."""
    tiny = tiny_model_path()
    if not (tiny / "config.json").exists():
        pytest.skip("tiny model missing")
    from rao_cli.main import app

    samples = [Sample(tree_id=f"t{i}", node_id="r", group_id="g", depth=0, token_ids=[1, 5, 9, 700 + i, 701],
                      assistant_mask=[0, 0, 0, 1, 1], behaviour_logprobs=[0, 0, 0, -10.0, -10.0], success=float(i),
                      reward=float(i), baseline=1.0 - i, advantage=2.0 * i - 1.0) for i in (0, 1)]
    sp = write_samples(tmp_path / "s.parquet", samples)
    (tmp_path / "c.yaml").write_text(f"name: x\n{section}:\n  loss_type: reinforce\n  lr: 0.001\n  micro_batch_size: 1\n")
    r = CliRunner().invoke(app, ["train", "--samples", str(sp), "--model", str(tiny), "--out", str(tmp_path / "ck"),
                                 "--config", str(tmp_path / "c.yaml"), "--iteration", "2",
                                 "--metrics-out", str(tmp_path / "m.jsonl")])
    assert r.exit_code == 0, r.output
    records = [json.loads(x) for x in (tmp_path / "m.jsonl").read_text().splitlines()]
    # what the campaign's parent reads: the trainer's phases as they begin, then step, progress, end
    phases = [x["phase"] for x in records if "phase" in x]
    assert phases == ["started, 2 samples read", "samples checked (2); loading the model",
                      "model and optimizer ready; first optimizer step running", "saving checkpoint"]
    rest = [x for x in records if "phase" not in x]
    assert [next(iter(x)) for x in rest] == ["step", "progress", "end"]
    assert rest[1] == {"progress": {"done": 1, "total": 1}}
    assert records[-1] is rest[-1]  # nothing is written after "end"
    line = next(x for x in r.output.splitlines() if '{"train/' in x)
    step = json.loads(line[line.index("{"):])
    assert step["train/tokens"] == 4 and step["train/samples"] == 2 and step["train/grad_norm"] > 0
    man = json.loads((tmp_path / "ck" / "rao-checkpoint.json").read_text())
    assert man["iteration"] == 2 and man["config"]["loss_type"] == "reinforce"


def test_accelerate_config_resolves_from_the_repository_wherever_the_campaign_runs(tmp_path, monkeypatch):
    from rao_core.paths import REPO_ROOT
    from rao_core.train.launch import resolve_accelerate_config

    monkeypatch.chdir(tmp_path)
    assert resolve_accelerate_config("configs/accelerate/fsdp.yaml") == REPO_ROOT / "configs/accelerate/fsdp.yaml"
    (tmp_path / "mine.yaml").write_text("distributed_type: NO\n")
    assert resolve_accelerate_config("mine.yaml") == tmp_path / "mine.yaml"  # the current folder first
    assert resolve_accelerate_config(None) is None
    with pytest.raises(FileNotFoundError, match="accelerate config not found: nope.yaml"):
        resolve_accelerate_config("nope.yaml")
