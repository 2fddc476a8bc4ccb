"""Task files are checked against their environment when read, before any rollout.

Every bad record gives ONE line naming the file, the line, the field and what was expected.
"""

from __future__ import annotations

import json

import pytest

from rao_core.envs import get_env, load_tasks, write_tasks
from rao_core.envs.base import TaskError


def _textcraft_record(**data_changes) -> dict:
    task = get_env("textcraft-synth").generate_tasks(n=1, seed=0, difficulty="easy")[0]
    rec = task.model_dump()
    rec["data"].update(data_changes)
    return rec


def _write(path, records) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def _error(path, env) -> str:
    with pytest.raises(ValueError) as e:
        load_tasks(path, env)
    msg = str(e.value)
    assert "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("change, field, expected", [
    ({"targets": {"zz9_i999": 1}}, "data.targets.zz9_i999", "expected a craftable item"),
    ("count", "data.targets.", "expected an int > 0"),
    ("inventory", "data.inventory.zz9_i999", "expected an item of the recipe graph"),
    ({"inventory": {}}, "data.targets", "expected targets craftable from the starting inventory"),
    ({"targets": {"m0_i0": 1}}, "data.targets.m0_i0", "expected a craftable item (tier >= 1)"),
    ({"graph": {"seed": "x"}}, "data.graph.seed", "expected an int"),
    ({"inventory": [1, 2]}, "data.inventory", "expected a dict"),
])
def test_textcraft_bad_records_name_file_line_field_and_expectation(tmp_path, change, field, expected):
    good = _textcraft_record()
    if change == "count":
        item = next(iter(good["data"]["targets"]))
        change = {"targets": {item: "one"}}
    elif change == "inventory":
        change = {"inventory": {**good["data"]["inventory"], "zz9_i999": 3}}
    path = _write(tmp_path / "tasks.jsonl", [good, _textcraft_record(**change)])
    msg = _error(path, get_env("textcraft-synth"))
    assert msg.startswith(f"{path}:2: ") and field in msg and expected in msg, msg


@pytest.mark.parametrize("rec, field", [
    ({"task_id": 123, "env": "textcraft-synth", "data": {}}, "task_id: Input should be a valid string"),
    ({"task_id": "a", "env": "textcraft-synth", "data": "not a dict"}, "data: Input should be a valid dictionary"),
    ({"task_id": "a", "env": "textcraft-synth", "colour": 1}, "colour: Extra inputs are not permitted"),
    ({"task_id": "a", "env": "oolong", "data": {}}, "env: task a is for environment 'oolong'"),
])
def test_wrong_top_level_types_give_one_line_with_the_field(tmp_path, rec, field):
    path = _write(tmp_path / "t.jsonl", [rec])
    msg = _error(path, get_env("textcraft-synth"))
    assert msg.startswith(f"{path}:1: not a valid task record: {field}"), msg


def test_unparseable_line_names_the_line(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(_textcraft_record()) + "\n{not json\n")
    assert _error(path, None) == (f"{path}:2: not a valid task record: invalid JSON at column 2: Expecting property "
                                  "name enclosed in double quotes")
    path.write_text('{"task_id": "a"\n')  # an unclosed record: where it ends, not json's "line 2 column 1"
    assert _error(path, None) == f"{path}:1: not a valid task record: invalid JSON at column 16: Expecting ',' delimiter"


@pytest.mark.parametrize("name, options", [
    ("textcraft-synth", {"difficulty": "extreme"}), ("textcraft-synth", {"split": "validation"}),
    ("oolong", {}), ("deepdive", {}), ("arte", {}),
])
def test_generated_tasks_validate(tmp_path, name, options):
    env = get_env(name)
    tasks = env.generate_tasks(n=4, seed=2, **options)
    path = write_tasks(tmp_path / "t.jsonl", tasks)
    assert load_tasks(path, env) == tasks


@pytest.mark.parametrize("name, change, field", [
    ("oolong", {"question": ""}, "data.question"),
    ("oolong", {"answer": 3}, "data.answer"),
    ("oolong", {"context": None}, "data.context"),
    ("deepdive", {"answers": [1], "answer": None}, "data.answers"),
    ("deepdive", {"corpus": None}, "data.corpus"),
    ("deepdive", {"corpus": {"params": {"n_people": "many"}}}, "data.corpus.params.n_people"),
    ("arte", {"message_ids": []}, "data.message_ids"),
    ("arte", {"corpus": {"path": "/nonexistent/emails.db"}}, "data.corpus.path"),
])
def test_other_environments_reject_bad_fields(name, change, field):
    env = get_env(name)
    task = env.generate_tasks(n=1, seed=0)[0]
    bad = task.model_copy(update={"data": {**task.data, **change}})
    with pytest.raises(TaskError) as e:
        env.validate_task(bad)
    assert e.value.field == field and "\n" not in str(e.value), str(e.value)


def test_deepdive_http_backend_needs_no_corpus():
    env = get_env("deepdive", backend="http", http_base_url="http://127.0.0.1:9")
    task = env.generate_tasks(n=1, seed=0)[0]
    env.validate_task(task.model_copy(update={"data": {**task.data, "corpus": None}}))


def test_campaign_refuses_a_bad_pool_before_serving(tmp_path, monkeypatch):
    """rao_campaign checks tasks.train_file before MLflow, S3 or the policy server are touched."""
    import flows.campaign as campaign

    def boom(*a, **k):
        raise AssertionError("the campaign went past the task-pool check")

    monkeypatch.setattr(campaign, "mlflow_setup", boom)
    monkeypatch.setattr(campaign, "serve_checkpoint", boom)
    path = _write(tmp_path / "pool.jsonl", [_textcraft_record(), _textcraft_record(targets={"zz9_i999": 1})])
    params = campaign.CampaignParams(overrides=[f"tasks.train_file={path}", "tasks.env=textcraft-synth"])
    with pytest.raises(ValueError, match=rf"^{path}:2: .*data\.targets\.zz9_i999"):
        campaign.rao_campaign.fn(params)
