"""A campaign started from the UI ends with its summary and MLflow link in its flow run: the
``<campaign>-summary`` markdown artifact, and a re-run of a complete campaign names the form's fields (not
``rao run``'s flags) and where that summary is."""

from __future__ import annotations

SUMMARY = {
    "campaign": "ui-demo", "mlflow_uri": "sqlite:////home/u/.rao/mlflow/mlflow.db", "mlflow_run_id": "abc123",
    "mlflow_experiment_id": "1", "s3_prefix": "s3://rao/ui-demo/", "iterations_planned": 1, "wall_s": 512.3,
    "completed_at": "2026-12-03 09:00:00 UTC",
    "base_eval": [{"mode": "recursive", "difficulty": "tier1", "n": 8, "success": 0.25, "ci95": "[0.07, 0.59]"}],
    "warm_start": {"register": {"version": "1", "champion": True}},
    "iterations": [{"iteration": 1, "metrics": {"success/root": 0.375},
                    "register": {"version": "2", "champion": False, "updated": True},
                    "eval_rows": [{"mode": "recursive", "difficulty": "tier1", "n": 8, "success": 0.5,
                                   "ci95": "[0.22, 0.78]"}]}],
}


def test_summary_markdown_has_the_results_the_artifacts_and_the_mlflow_link():
    import sys
    from pathlib import Path

    from tasks.bookkeeping import summary_markdown

    md = summary_markdown(SUMMARY)
    assert md.startswith("## Campaign ui-demo\n")
    assert "| 0 | | recursive/tier1: 0.25 [0.07, 0.59] (n 8) | 1 | yes |" in md
    assert "| 1 | 0.38 | recursive/tier1: 0.50 [0.22, 0.78] (n 8) | 2 |  |" in md
    assert "- artifacts: s3://rao/ui-demo/" in md
    assert ("- MLflow: http://127.0.0.1:5000/#/experiments/1/runs/abc123?workflowType=machine_learning (start the "
            f"UI: `{Path(sys.executable).parent / 'mlflow'} ui --backend-store-uri sqlite:////home/u/.rao/mlflow/mlflow.db`)") in md


def test_mlflow_link_on_a_tracking_server_is_the_page_itself():
    from flows.campaign import mlflow_link

    assert mlflow_link({**SUMMARY, "mlflow_uri": "http://10.0.0.5:5000/"}) == (
        "http://10.0.0.5:5000/#/experiments/1/runs/abc123?workflowType=machine_learning")


def test_a_rerun_names_the_forms_fields_in_the_ui_and_the_flags_in_the_cli():
    from flows.campaign import already_complete_line

    ui = already_complete_line(SUMMARY)
    assert "--name" not in ui and "--iterations" not in ui
    assert ui.endswith("the summary in this flow run's artifact ui-demo-summary is that run's (use another name, or "
                       "more iterations, in the run form to train further)")
    assert already_complete_line(SUMMARY, cli=True).endswith(
        "the summary below is that run's (use another --name, or more --iterations to train further)")


def test_the_summary_artifact_is_written_in_a_flow_run_only(monkeypatch):
    import prefect.artifacts

    import infra.stage_io
    from tasks import bookkeeping

    made = []
    monkeypatch.setattr(prefect.artifacts, "create_markdown_artifact",
                        lambda key, markdown, **kw: made.append((key, markdown)))
    bookkeeping.summary_artifact(SUMMARY)
    assert made == []  # not in a run
    monkeypatch.setattr(infra.stage_io, "in_prefect_run", lambda: True)
    bookkeeping.summary_artifact(SUMMARY, "a note")
    (key, md), = made
    assert key == "ui-demo-summary" and md.startswith("## Campaign ui-demo\n\na note\n")


def test_learning_curve_ticks_are_whole_iterations(monkeypatch):
    """Two points (iterations 0 and 1) drew ticks at 0.0, 0.2, ... 1.0."""
    from types import SimpleNamespace

    from tasks import tracking

    class History:
        def get_metric_history(self, run_id, key):
            return [SimpleNamespace(step=0, value=0.25), SimpleNamespace(step=1, value=0.5)]

    monkeypatch.setattr(tracking, "_client", History)
    fig = tracking.learning_curve_figure("run", ["eval/recursive/tier1/success"], "t")
    ticks = [t for t in fig.axes[0].get_xticks() if -0.5 <= t <= 1.5]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_iteration_runs_carry_the_config_as_parameters(tmp_path, monkeypatch):
    """The registry's Compare view of two versions compares their iteration runs: their Parameters section was
    empty (only the campaign run had the config)."""
    import mlflow

    from flows.campaign import CampaignParams, iteration_run
    from infra.tracking import configure_mlflow
    from infra.stage_io import RunContext

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    configure_mlflow(f"sqlite:///{tmp_path / 'm.db'}")
    exp = mlflow.create_experiment("c", artifact_location=(tmp_path / "a").as_uri())
    cfg = CampaignParams().resolve()
    ctx = RunContext(config=cfg, s3={}, mlflow_uri="", mlflow_experiment_id=exp,
                     campaign_run_id=mlflow.MlflowClient().create_run(exp).info.run_id)
    run = iteration_run(ctx, 1)
    params = mlflow.MlflowClient().get_run(run).data.params
    assert params["algo.G"] == str(cfg.algo.G) and params["trainer.lr"] == str(cfg.trainer.lr)
    assert iteration_run(ctx, 1) == run  # found again on resume, parameters not logged twice
