"""``rao train`` / ``rao sft``: an existing ``--out`` that is not a checkpoint is refused before any work
(its files stay), a checkpoint is still replaced; ``--config`` is validated whole, as ``rao run`` does."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.cli import one_error_line, run_cli


def _writes_checkpoint(out: Path) -> None:
    """What the trainer does at the end: a checkpoint folder replaces ``out`` (atomic_folder)."""
    from rao_core.train.checkpoint import MANIFEST_NAME, atomic_folder

    with atomic_folder(out) as tmp:
        (tmp / "config.json").write_text("{}")
        (tmp / "model.safetensors").write_bytes(b"new")
        (tmp / MANIFEST_NAME).write_text("{}")


class _Written(list):
    configs: list


@pytest.fixture
def fake_training(monkeypatch):
    """``rao train`` and ``rao sft`` with their training replaced by a plain atomic checkpoint write (no torch
    work); the list records the folders written."""
    import rao_core.samples
    import rao_core.train.trainer
    import rao_core.warmstart

    written = _Written()
    written.configs = []  # the TrainerConfig each `rao train` got

    def train(samples, model_path, out_dir, config=None, **kw):
        _writes_checkpoint(Path(out_dir))
        written.append(Path(out_dir))
        written.configs.append(config)
        return rao_core.train.trainer.TrainResult(checkpoint=Path(out_dir), metrics=[], manifest={})

    def run_warm_start(env, model_path, out_dir, **kw):
        _writes_checkpoint(Path(out_dir))
        written.append(Path(out_dir))
        return SimpleNamespace(checkpoint=Path(out_dir), stats={}, num_samples=0, num_tokens=0,
                               num_assistant_tokens=0, demo_wall_s=0.0, sft_wall_s=0.0)

    monkeypatch.setattr(rao_core.train.trainer, "train", train)
    monkeypatch.setattr(rao_core.warmstart, "run_warm_start", run_warm_start)
    # `rao train` reads --samples before any work: one stand-in sample (the fake train does not look at it)
    monkeypatch.setattr(rao_core.samples, "read_samples", lambda path: SimpleNamespace(samples=[object()]))
    return written


def _argv(command: str, tmp_path: Path, out: Path, *extra: str) -> list[str]:
    if command == "train":  # --model is checked before any work: a folder with a config.json
        (tmp_path / "m").mkdir(exist_ok=True)
        (tmp_path / "m" / "config.json").write_text("{}")
        return ["train", "--samples", str(tmp_path / "s.jsonl"), "--model", str(tmp_path / "m"), "--out", str(out),
                *extra]
    return ["sft", "--env", "example", "--out", str(out), *extra]


@pytest.mark.parametrize("command", ["train", "sft"])
def test_an_out_folder_that_is_not_a_checkpoint_is_refused_and_kept(capsys, tmp_path, fake_training, command):
    out = tmp_path / "dir"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    code, _, err = run_cli(capsys, *_argv(command, tmp_path, out))
    assert code == 2 and one_error_line(err) == (f"error: --out {out} exists and is not a checkpoint (holds "
                                                  "precious.txt); choose another folder or remove it")
    assert (out / "precious.txt").read_text() == "keep me" and sorted(p.name for p in out.iterdir()) == ["precious.txt"]
    assert fake_training == []  # refused before any work


@pytest.mark.parametrize("command", ["train", "sft"])
def test_an_existing_checkpoint_is_still_replaced(capsys, tmp_path, fake_training, command):
    from rao_core.train.checkpoint import MANIFEST_NAME, check_out_folder

    out = tmp_path / "ck"
    out.mkdir()
    (out / "config.json").write_text("{}")
    (out / "model.safetensors").write_bytes(b"old")
    check_out_folder(out)  # accepted: a checkpoint (weights) may be replaced
    code, _, err = run_cli(capsys, *_argv(command, tmp_path, out))
    assert code == 0, err
    assert fake_training == [out] and (out / "model.safetensors").read_bytes() == b"new" and (out / MANIFEST_NAME).exists()


def test_the_check_accepts_checkpoints_and_empty_folders_and_refuses_anything_else(tmp_path):
    from rao_core.train.checkpoint import MANIFEST_NAME, OutFolderError, check_out_folder

    check_out_folder(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    check_out_folder(tmp_path / "empty")
    for name, files in [("full", ["config.json", "model-00001-of-00002.safetensors", "tokenizer.json"]),
                        ("lora", ["adapter_config.json", "adapter_model.safetensors"]),
                        ("written", [MANIFEST_NAME, "config.json", ".complete"])]:
        (tmp_path / name).mkdir()
        for f in files:
            (tmp_path / name / f).write_text("{}")
        check_out_folder(tmp_path / name)
    (tmp_path / "notes").mkdir()
    for f in ["config.json", "a.txt", "b.txt", "c.txt"]:  # a config.json without weights is not a checkpoint
        (tmp_path / "notes" / f).write_text("x")
    with pytest.raises(OutFolderError, match=r"holds a\.txt, b\.txt, c\.txt, \.\.\. \(4 entries\)\); choose another"):
        check_out_folder(tmp_path / "notes")
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutFolderError, match="exists and is not a folder"):
        check_out_folder(tmp_path / "file", "--out")


def test_the_trainer_itself_refuses_before_loading_anything(tmp_path):
    """Library callers of train() get the same check (the model path does not even exist)."""
    from rao_core.train.checkpoint import OutFolderError
    from rao_core.train.trainer import train

    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    with pytest.raises(OutFolderError, match=r"out_dir .* exists and is not a checkpoint \(holds precious\.txt\)"):
        train([], tmp_path / "no-model", tmp_path / "out")
    assert (tmp_path / "out" / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("text", ["name: x\nn_taks: 3\ntrainer:\n  lr: 0.001\n",
                                  "name: x\ntrainr:\n  lr: 0.001\n",
                                  "warm_start:\n  trainer:\n    lr: fast\n",
                                  "lrr: 0.001\n"])
@pytest.mark.parametrize("command", ["train", "sft"])
def test_config_is_validated_whole_as_rao_run_does(capsys, tmp_path, fake_training, command, text):
    from rao_core.config import ConfigError, load_config

    f = tmp_path / "c.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError) as expected:  # what `rao run --config` says about the file
        load_config(f, check_paths=False)
    assert "unknown field" in str(expected.value) or "lr = 'fast'" in str(expected.value)
    code, _, err = run_cli(capsys, *_argv(command, tmp_path, tmp_path / "ck", "--config", str(f)))
    assert code == 2 and one_error_line(err) == f"error: {expected.value}"
    assert fake_training == []


@pytest.mark.parametrize("command", ["train", "sft"])
def test_a_typo_inside_a_section_names_the_file_and_key(capsys, tmp_path, fake_training, command):
    f = tmp_path / "c.yaml"
    f.write_text("warm_start:\n  n_taks: 3\n")
    code, _, err = run_cli(capsys, *_argv(command, tmp_path, tmp_path / "ck", "--config", str(f)))
    assert code == 2 and one_error_line(err) == f"error: {f}: warm_start.n_taks = 3: unknown field"


@pytest.mark.parametrize("text, lr", [('{"lr": 0.002, "loss_type": "reinforce"}', 0.002),  # the campaign child's
                                      ("name: x\ntrainer:\n  lr: 0.003\n", 0.003),
                                      ("name: x\ntrain:\n  lr: 0.004\n", 0.004)])  # the older name of `trainer:`
def test_train_still_reads_its_trainer_settings(capsys, tmp_path, fake_training, text, lr):
    f = tmp_path / "c.yaml"
    f.write_text(text)
    code, _, err = run_cli(capsys, *_argv("train", tmp_path, tmp_path / "ck", "--config", str(f)))
    assert code == 0, err
    assert [c.lr for c in fake_training.configs] == [lr]


def test_a_typo_under_the_older_train_section_names_the_given_file(capsys, tmp_path, fake_training):
    f = tmp_path / "c.yaml"
    f.write_text("name: x\ntrain:\n  lrr: 1\n")
    code, _, err = run_cli(capsys, *_argv("train", tmp_path, tmp_path / "ck", "--config", str(f)))
    assert code == 2 and one_error_line(err) == f"error: {f}: trainer.lrr = 1: unknown field"


def test_sft_still_reads_demo_settings_written_directly_in_warm_start(capsys, tmp_path, fake_training):
    """``warm_start.single_agent_fraction`` etc. (``rao sft``'s short form of ``warm_start.options``) pass the
    campaign check; a bad value there is still DemoConfig's error."""
    f = tmp_path / "c.yaml"
    f.write_text("warm_start:\n  n_tasks: 2\n  single_agent_fraction: 0.25\n  trainer:\n    lr: 2.0e-4\n")
    code, _, err = run_cli(capsys, *_argv("sft", tmp_path, tmp_path / "ck", "--config", str(f)))
    assert code == 0, err
    f.write_text("warm_start:\n  parallel_prob: 3\n")
    code, _, err = run_cli(capsys, *_argv("sft", tmp_path, tmp_path / "ck2", "--config", str(f)))
    assert code == 2 and "parallel_prob" in one_error_line(err)


def test_sft_demonstrates_the_configs_generator_and_the_single_agent_on_request(capsys, tmp_path, monkeypatch):
    """``rao sft --config``: demonstrations from the campaign's ``tasks.generator_options`` (its recipe graph);
    ``--single-agent``: delegation-off demonstrations whose node gets a whole recursive tree's steps."""
    import rao_core.warmstart

    got = []

    def run_warm_start(env, model_path, out_dir, demo_config=None, runtime_config=None, **kw):
        got.append((demo_config, runtime_config))
        _writes_checkpoint(Path(out_dir))
        return SimpleNamespace(checkpoint=Path(out_dir), stats={}, num_samples=0, num_tokens=0,
                               num_assistant_tokens=0, demo_wall_s=0.0, sft_wall_s=0.0)

    monkeypatch.setattr(rao_core.warmstart, "run_warm_start", run_warm_start)
    cfg = "configs/experiment-textcraft-deeper.yaml"
    for extra in ([], ["--single-agent"]):
        code, _, err = run_cli(capsys, "sft", "--config", cfg, "--out", str(tmp_path / f"o{len(extra)}"), *extra)
        assert code == 0, err
    (demo, rc), (single, rc1) = got
    assert demo.generator_options == single.generator_options == {"items_per_tier": 300}
    assert (demo.single_agent_fraction, demo.recurse, rc.max_steps_per_node) == (0.0, True, 6)
    assert (single.single_agent_fraction, rc1.max_steps_per_node) == (1.0, 6 * (1 + 4))
