"""Environments named by import path ``module:Class`` (rao_core.envs.register_import_path; docs/tutorial.md)."""

from __future__ import annotations

import pytest

from rao_core import envs

MODULE = '''
from rao_core.envs.example import BoxSumEnv, BoxSumExpert


class Boxes(BoxSumEnv):
    name = "boxes-{tag}"
    expert_policy = "{mod}:Expert"
    judge_prompt = "boxes.md"


class Expert(BoxSumExpert):
    pass


class NotAnEnv:
    name = "nope"


class Clash(BoxSumEnv):
    name = "textcraft-synth"
'''


@pytest.fixture
def plugin(tmp_path, monkeypatch, request):
    """A module ``plug_<test>`` in a fresh folder made the current one; REGISTRY restored afterwards."""
    tag = request.node.name.replace("test_", "").replace("_", "")[:20]
    mod = f"plug_{tag}"
    (tmp_path / f"{mod}.py").write_text(MODULE.format(tag=tag, mod=mod))
    (tmp_path / "boxes.md").write_text("prompt")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(envs, "REGISTRY", dict(envs.REGISTRY))
    return mod, f"boxes-{tag}"


def test_an_import_path_registers_the_class_under_its_name_with_its_expert_and_prompt(plugin):
    mod, name = plugin
    assert envs.canonical_name(f"{mod}:Boxes") == name  # found from the current folder, registered once
    assert envs.REGISTRY[name].aliases == (f"{mod}:Boxes",)
    assert envs.env_class(name).__name__ == "Boxes" and envs.get_env(f"{mod}:Boxes").name == name
    assert type(envs.oracle_policy(name)).__name__ == "Expert"
    assert envs.packaged_judge_prompt(f"{mod}:Boxes").read_text() == "prompt"
    tasks = envs.get_env(f"{mod}:Boxes").generate_tasks(n=2, seed=0, difficulty="easy")
    assert {t.env for t in tasks} == {name}


@pytest.mark.parametrize("target, expected", [
    ("plug_missing_zz:Boxes", "cannot import it (ModuleNotFoundError"),
    ("{mod}:Nothing", "cannot import it (AttributeError"),
    ("{mod}:NotAnEnv", "is not an Environment subclass"),
    ("{mod}:Clash", "its name 'textcraft-synth' is already registered for rao_core.envs.textcraft:TextCraftEnv"),
])
def test_a_bad_import_path_is_one_error_naming_it(plugin, target, expected):
    mod, _ = plugin
    target = target.format(mod=mod)
    with pytest.raises(ValueError, match="environment") as err:
        envs.env_class(target)
    assert str(err.value).startswith(f"environment {target!r}: ") and expected in str(err.value), str(err.value)
    assert envs.REGISTRY["textcraft-synth"].env == "rao_core.envs.textcraft:TextCraftEnv"  # nothing replaced


def test_the_config_accepts_an_import_path_and_names_a_bad_one(plugin, tmp_path):
    from rao_core.config import ConfigError, load_config

    mod, name = plugin
    (tmp_path / "c.yaml").write_text(f"tasks:\n  env: {mod}:Boxes\n  difficulties: [easy]\neval:\n"
                                     "  difficulties: [easy]\nwarm_start:\n  mode: none\n")
    assert load_config(tmp_path / "c.yaml").tasks.env == f"{mod}:Boxes"
    (tmp_path / "c.yaml").write_text(f"tasks:\n  env: {mod}:Nothing\n")
    with pytest.raises(ConfigError, match=f"tasks.env = '{mod}:Nothing': environment '{mod}:Nothing': cannot "
                                          "import it"):
        load_config(tmp_path / "c.yaml")
