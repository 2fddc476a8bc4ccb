"""The end of a campaign whose iterations made no update says that no version became champion, and why (before:
the registry showed no champion and a disabled Compare, and nothing said so)."""

from __future__ import annotations


def _summary(*iterations):
    return {"warm_start": {}, "iterations": [
        {"iteration": k, "register": {"model": "rao-policy-smoke", "version": str(k), "champion": False,
                                      "updated": updated}, "evaluated": evaluated, "guard": guard}
        for k, updated, evaluated, guard in iterations]}


def test_no_champion_says_why_for_each_iteration(monkeypatch):
    import tasks.tracking
    from flows.campaign import no_champion_line
    from rao_core.config import load_config

    cfg = load_config("configs/cpu-smoke.yaml", {"eval.every": 2})
    monkeypatch.setattr(tasks.tracking, "alias_version", lambda name, alias: None)
    line = no_champion_line(cfg, _summary((1, False, True, None), (2, True, False, None),
                                          (3, True, True, {"status": "collapse"})))
    assert line == ("campaign smoke: no version of rao-policy-smoke became champion (iteration 1 made no optimizer "
                    "step; iteration 2 was not evaluated (eval.every 2); iteration 3 was held back by the collapse "
                    "guard): the nightly regression (rao evaluate) has nothing to compare with until a version that "
                    "made an update is evaluated")
    monkeypatch.setattr(tasks.tracking, "alias_version", lambda name, alias: object())  # a champion: no line
    assert no_champion_line(cfg, _summary((1, True, True, None))) is None


def test_rao_run_prints_it_as_its_last_line(capsys, monkeypatch):
    from rao_cli import pipeline_cmd

    summary = {"campaign": "smoke", "s3_prefix": "s3://rao/smoke/", "wall_s": 1.0, "iterations": [],
               "mlflow_uri": "sqlite:///x.db", "mlflow_run_id": "r", "no_champion": "campaign smoke: no version ..."}
    monkeypatch.setattr(pipeline_cmd, "_summary_table", lambda s: "table")
    monkeypatch.setattr(pipeline_cmd, "stage_table", lambda s: "stages")
    pipeline_cmd.print_summary(summary)
    assert capsys.readouterr().out.strip().splitlines()[-1] == "warning: campaign smoke: no version ..."
