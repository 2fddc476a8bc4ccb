"""What the Prefect run forms show (found in a real browser): numeric fields as plain number
inputs whose help names the config's value (they showed `int | None` toggles failing with `Property is type
"None"`), the campaign-name rule checked as it is typed, and the nightly form's texts without RST backticks or
internal function names."""

from __future__ import annotations

import re

import pytest
from prefect.utilities.callables import parameter_schema

NUMBERS = {"iterations": ("integer", "cpu-smoke: 2"), "tasks_per_iteration": ("integer", "cpu-smoke: 6"),
           "G": ("integer", "cpu-smoke: 4"), "lam": ("number", "textcraft-synth 0.0"),  # TextCraftEnv.delegation_cap
           "max_depth": ("integer", "cpu-smoke: 1"), "context_window": ("integer", "cpu-smoke: 3072"),
           "seed": ("integer", "cpu-smoke: 0")}


def _schema(flow_fn) -> dict:
    return parameter_schema(flow_fn.fn).model_dump()


def test_campaign_form_numbers_are_plain_inputs_naming_the_configs_value():
    from flows.campaign import CampaignParams, rao_campaign

    sch = _schema(rao_campaign)
    props = sch["definitions"]["CampaignParams"]["properties"]
    for field, (kind, hint) in NUMBERS.items():
        p = props[field]
        assert p["type"] == kind and "anyOf" not in p and "default" not in p, (field, p)
        assert hint in p["description"], (field, p["description"])
    assert not [k for k, v in sch["properties"]["params"]["default"].items() if v is None]  # no null to reject
    # empty still means the file's value, and a set number still overrides it
    base = CampaignParams().resolve()
    assert CampaignParams.model_validate(CampaignParams().model_dump()).resolve().iterations == base.iterations
    assert CampaignParams.model_validate({"G": 8}).resolve().algo.G == 8
    assert CampaignParams(iterations=3).model_dump()["iterations"] == 3


def test_campaign_name_rule_is_in_the_form():
    from flows.campaign import CampaignParams, rao_campaign

    pattern = _schema(rao_campaign)["definitions"]["CampaignParams"]["properties"]["name"]["pattern"]
    for name, ok in (("", True), ("smoke", True), ("ui-demo-2", True), ("Smoke", False), ("my run", False),
                     ("-x", False)):
        assert bool(re.search(pattern, name)) == ok, name
        if not ok:
            with pytest.raises(ValueError, match="lowercase letters, digits and dashes"):
                CampaignParams(name=name)


def test_nightly_form_texts_are_plain_and_the_tolerance_a_number():
    from flows.evaluate import rao_evaluate

    sch = _schema(rao_evaluate)
    texts = [d.get("description", "") for d in sch["definitions"].values()]
    texts += [p.get("description", "") for d in sch["definitions"].values() for p in d["properties"].values()]
    assert not [t for t in texts if "``" in t or "champion_suite" in t or ":func:" in t], texts
    tol = sch["definitions"]["EvaluateParams"]["properties"]["tolerance"]
    assert tol["type"] == "number" and "anyOf" not in tol and "default" not in tol
    assert "cpu-smoke.yaml: 0.1" in tol["description"]
    assert "tolerance" not in sch["properties"]["params"]["default"]
    assert sch["definitions"]["SuiteEntry"]["properties"]["n_tasks"]["default"] == 100  # the decision's n
