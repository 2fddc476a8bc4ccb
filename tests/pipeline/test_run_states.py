"""A failed, crashed or cancelled Prefect flow run leaves no MLflow run RUNNING; flow runs are named after
the campaign and iteration and linked to their MLflow runs."""

from __future__ import annotations

from types import SimpleNamespace
from uuid import UUID

import pytest


@pytest.fixture
def mlflow_sqlite(tmp_path, monkeypatch):
    from infra.tracking import configure_mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    return configure_mlflow()


def _runs(where: str):
    import mlflow

    return mlflow.search_runs(search_all_experiments=True, output_format="list", filter_string=where)


@pytest.mark.services
def test_a_failed_iteration_marks_its_run_and_the_campaign_run_failed(tmp_path, tiny, s3_server, prefect_harness,
                                                                    mlflow_sqlite, monkeypatch):
    import flows.campaign as fc
    from prefect.client.orchestration import get_client

    monkeypatch.setenv("RAO_HOME", str(tmp_path / "home"))
    for k, v in s3_server.settings().env().items():
        monkeypatch.setenv(k, v)
    from infra.stage_records import Checkpoint, WarmStartOutput

    monkeypatch.setattr(fc, "warm_start", lambda ctx: WarmStartOutput(checkpoint=Checkpoint(name="base", local=str(tiny)),
                                                                      mode="none"))

    def no_server(ctx, ckpt):
        raise RuntimeError("vLLM did not start")

    monkeypatch.setattr(fc, "serve_checkpoint", no_server)
    params = fc.CampaignParams(config="configs/cpu-smoke.yaml", name="fails", iterations=1, model_path=str(tiny),
                               overrides=["warm_start.mode=none", "eval.enabled=false"])
    with pytest.raises(RuntimeError, match="vLLM did not start"):
        fc.rao_campaign(params)

    [camp] = _runs("tags.`rao.campaign` = 'fails' and tags.`rao.kind` = 'campaign'")
    [it] = _runs("tags.`rao.campaign` = 'fails' and tags.`rao.kind` = 'iteration'")
    assert (camp.info.status, it.info.status) == ("FAILED", "FAILED")  # not RUNNING forever
    assert it.data.tags["mlflow.parentRunId"] == camp.info.run_id
    with get_client(sync_client=True) as client:  # each MLflow run names its Prefect flow run, by id and name
        for run, name in ((camp, "fails"), (it, "fails-iter-1")):
            assert run.data.tags["rao.prefect_flow_run"] == name
            fr = client.read_flow_run(UUID(run.data.tags["rao.prefect_flow_run_id"]))
            assert (fr.name, fr.state.type.value) == (name, "FAILED")
            assert run.data.tags.get("rao.prefect_url", str(fr.id)).endswith(str(fr.id))  # set when a UI is known


@pytest.mark.services
def test_the_state_hook_kills_cancelled_runs_and_fails_crashed_ones(mlflow_sqlite):
    import mlflow
    from prefect.states import Cancelling, Crashed

    from infra.tracking import ensure_experiment
    from tasks import tracking

    client = mlflow.MlflowClient()
    exp = ensure_experiment("hooks")

    def campaign(flow_run_id: str) -> tuple[str, str, str]:
        """A RUNNING campaign run linked to ``flow_run_id``, a RUNNING child and an unrelated RUNNING run."""
        parent = client.create_run(exp, tags={tracking.FLOW_RUN_TAG: flow_run_id}).info.run_id
        child = client.create_run(exp, tags={"mlflow.parentRunId": parent}).info.run_id
        other = client.create_run(exp, tags={tracking.FLOW_RUN_TAG: "another-flow-run"}).info.run_id
        return parent, child, other

    def status(run_id: str) -> str:
        return client.get_run(run_id).info.status

    for state, want in ((Cancelling(), "KILLED"), (Crashed(), "FAILED")):
        fid = f"flow-run-{want}"
        parent, child, other = campaign(fid)
        tracking.end_mlflow_runs(None, SimpleNamespace(id=fid), state)
        assert (status(parent), status(child), status(other)) == (want, want, "RUNNING")
    done = client.create_run(exp, tags={tracking.FLOW_RUN_TAG: "f3"}).info.run_id
    client.set_terminated(done)  # FINISHED runs are left alone
    assert tracking.end_flow_run_runs("f3", "FAILED") == [] and status(done) == "FINISHED"
    tracking.claim_run(done)  # a resumed campaign's run is RUNNING again
    assert status(done) == "RUNNING"
    assert set(tracking.END_HOOKS) == {"on_failure", "on_crashed", "on_cancellation"}
