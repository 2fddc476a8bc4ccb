"""``rao campaigns list`` / ``rm NAME`` / ``fetch NAME``: the disk a campaign holds, local and on S3, freeing it,
and fetching its checkpoints back.

A campaign holds ``$RAO_HOME/campaigns/NAME`` (a cache) and everything under ``s3://BUCKET/NAME/`` (the store).
``list`` shows both sizes, the checkpoints on S3 and the registered champion; ``rm`` deletes both, except the
checkpoint the ``champion`` alias points at unless ``--force``, and detaches the campaign's MLflow runs and model
versions from the name (:func:`_detach_tracking`) so a new campaign of that name does not resume into them;
``fetch`` copies checkpoints back to the folders the experiment records name (``infra.retention.fetch_checkpoint``).
The S3 store is the config's (``--config``; ``RAO_S3_ENDPOINT``, the one of ``rao services up``, or an embedded
SeaweedFS started for the command). Docs: docs/pipeline/gpu.md (retention), docs/getting-started.md#commands.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import typer

from rao_cli import InputError, make_console

app = typer.Typer(help="Show and free the disk campaigns hold (local cache and S3).", no_args_is_help=True)
console = make_console()

_CONFIG_HELP = "Campaign config whose storage and tracking are used (bucket, endpoint, MLflow)."


def _config(config: str | None):
    from rao_core.config import load_config
    from rao_core.paths import REPO_ROOT

    path = None
    if config:
        path = Path(config)
        if not path.is_absolute() and not path.exists():
            path = REPO_ROOT / path
    return load_config(path).with_env_overrides()


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB" if n < 1e9 else f"{n / 1e9:,.2f} GB"


def _objects(s3, prefix: str = "", delimiter: str | None = None) -> tuple[list[dict[str, Any]], list[str]]:
    """(objects with Key and Size, common prefixes) under ``prefix`` of the bucket."""
    client, objs, prefixes, token = s3.client(), [], [], None
    while True:
        kw: dict[str, Any] = {"Bucket": s3.bucket, "Prefix": prefix}
        if delimiter:
            kw["Delimiter"] = delimiter
        if token:
            kw["ContinuationToken"] = token
        r = client.list_objects_v2(**kw)
        objs += r.get("Contents", [])
        prefixes += [p["Prefix"] for p in r.get("CommonPrefixes", [])]
        if not r.get("IsTruncated"):
            return objs, prefixes
        token = r["NextContinuationToken"]


def _all(search: Any, *args: Any, **kwargs: Any) -> list[Any]:
    """Every result of an MLflow ``search_*`` call, following its page tokens (one call returns at most a page:
    100 registered models, 1000 experiments)."""
    out, token = [], None
    while True:
        page = search(*args, page_token=token, **kwargs) if token else search(*args, **kwargs)
        out += list(page)
        token = getattr(page, "token", None)
        if not token:
            return out


def _local_root() -> Path:
    from rao_core.paths import rao_home

    return rao_home() / "campaigns"


def _checkpoint_key(source: str, bucket: str) -> str | None:
    """The S3 key of a model version's checkpoint folder (``s3://BUCKET/KEY``), or None outside ``bucket``."""
    src = source.rstrip("/")
    return src[len(f"s3://{bucket}/"):] if src.startswith(f"s3://{bucket}/") else None


def _champions(bucket: str) -> dict[str, list[tuple[str, str, str]]]:
    """{campaign: [(registered model, version, checkpoint key under the bucket)]} of every ``champion`` alias
    whose source is ``s3://BUCKET/CAMPAIGN/...``."""
    from mlflow import MlflowClient

    client, out = MlflowClient(), {}
    for rm in _all(client.search_registered_models):
        aliases = rm.aliases if isinstance(rm.aliases, dict) else {a.alias: a.version for a in rm.aliases}
        if "champion" not in aliases:
            continue
        mv = client.get_model_version(rm.name, aliases["champion"])
        if key := _checkpoint_key(mv.source, bucket):
            out.setdefault(key.partition("/")[0], []).append((rm.name, str(mv.version), key))
    return out


def _check_name(name: str) -> None:
    from rao_core.config import NAME_PATTERN

    if not re.fullmatch(NAME_PATTERN, name):
        raise typer.BadParameter(f"{name!r} is not a campaign name (lower-case letters, digits, '-')",
                                 param_hint="'NAME'")


def _with_services(cfg):
    from flows.campaign import storage
    from infra.tracking import configure_mlflow

    configure_mlflow(cfg.tracking.tracking_uri)
    return storage(cfg)


@app.command("list")
def list_cmd(config: str = typer.Option(None, "--config", help=_CONFIG_HELP)) -> None:
    """Every campaign (local folders and S3 prefixes) with the bytes it holds locally and on S3, its checkpoints
    on S3 and the champion it holds."""
    from rich.table import Table

    from infra.retention import folder_bytes

    cfg = _config(config)
    root = _local_root()
    with _with_services(cfg) as s3:
        _, prefixes = _objects(s3, "", "/")
        names = sorted({p.rstrip("/") for p in prefixes}
                       | ({p.name for p in root.iterdir() if p.is_dir()} if root.is_dir() else set()))
        champions = _champions(s3.bucket)
        t = Table(title=f"campaigns (local {root}, S3 s3://{s3.bucket}/)")
        for col in ("campaign", "local", "S3", "checkpoints on S3", "champion"):
            t.add_column(col)
        tot_local = tot_s3 = 0
        for name in names:
            objs, _ = _objects(s3, f"{name}/")
            s3_bytes, local = sum(o["Size"] for o in objs), folder_bytes(root / name)
            ckpts = sorted(int(m.group(1)) for o in objs
                           if (m := re.fullmatch(rf"{re.escape(name)}/iter-(\d+)/checkpoint\.manifest\.json", o["Key"])))
            champ = ", ".join(f"{m} v{v} ({k.removeprefix(name + '/').removesuffix('/checkpoint')})"
                              for m, v, k in champions.get(name, []))
            t.add_row(name, _mb(local), _mb(s3_bytes), ", ".join(f"iter-{k}" for k in ckpts) or "-", champ or "-")
            tot_local, tot_s3 = tot_local + local, tot_s3 + s3_bytes
        t.add_row("total", _mb(tot_local), _mb(tot_s3), "", "")
    console.print(t)


def _detach_tracking(mlc: Any, name: str, bucket: str,
                     deleted: set[str]) -> tuple[int, int, str, list[str], list[tuple[str, str]]]:
    """Retag every MLflow run (active or deleted, in any experiment) and model version whose ``rao.campaign`` is
    ``name`` to ``name~removed-<UTC time>``, keeping ``name`` in ``rao.removed_campaign``: a later campaign of
    that name must not resume into them. Aliases (``champion``, ``candidate``) on a version whose checkpoint is
    in ``deleted`` (manifest keys under ``bucket``) are removed; one on a kept checkpoint stays. Returns (runs,
    versions, the new tag value, the removed aliases as ``model@alias``, the (model, version) pairs whose
    checkpoint is in ``deleted``: the caller tags them ``rao.pruned`` once the files are gone). Resume finds a
    campaign's runs by that tag and skips the (metric, step) points they hold, hence the new name; the runs and
    versions themselves are kept (they are small). ``rm`` calls it before deleting any file, so a failure here can
    be retried with the same command."""
    import time

    from mlflow.entities import ViewType

    gone = f"{name}~removed-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
    runs = 0
    exps = [e.experiment_id for e in _all(mlc.search_experiments, view_type=ViewType.ALL)]
    for i in range(0, len(exps), 100):  # search_runs takes a bounded list of experiments
        for r in _all(mlc.search_runs, exps[i:i + 100], filter_string=f"tags.`rao.campaign` = '{name}'",
                      run_view_type=ViewType.ALL, max_results=50000):
            mlc.set_tag(r.info.run_id, "rao.removed_campaign", name)
            mlc.set_tag(r.info.run_id, "rao.campaign", gone)
            runs += 1

    def in_deleted(source: str) -> bool:
        key = _checkpoint_key(source, bucket)
        return bool(key) and key.startswith(f"{name}/") and f"{key}.manifest.json" in deleted

    versions, unaliased, pruned = 0, [], []
    for rm in _all(mlc.search_registered_models):
        for mv in _all(mlc.search_model_versions, f"name = '{rm.name}'"):
            if mv.tags.get("rao.campaign") == name:
                mlc.set_model_version_tag(rm.name, mv.version, "rao.removed_campaign", name)
                mlc.set_model_version_tag(rm.name, mv.version, "rao.campaign", gone)
                versions += 1
            if in_deleted(mv.source):
                pruned.append((rm.name, str(mv.version)))
        aliases = mlc.get_registered_model(rm.name).aliases  # search results leave aliases out
        aliases = aliases if isinstance(aliases, dict) else {a.alias: a.version for a in aliases}
        for alias, version in aliases.items():
            if (rm.name, str(version)) in pruned:
                mlc.delete_registered_model_alias(rm.name, alias)
                unaliased.append(f"{rm.name}@{alias}")
    return runs, versions, gone, unaliased, pruned


@app.command("rm")
def rm_cmd(
    name: str = typer.Argument(..., help="Campaign name (as `rao campaigns list` shows it)."),
    force: bool = typer.Option(False, "--force", help="Also delete the checkpoint a registered champion points at."),
    config: str = typer.Option(None, "--config", help=_CONFIG_HELP),
) -> None:
    """Delete a campaign's local folder and its S3 objects; the registered champion's checkpoint stays on S3
    unless --force."""
    from mlflow import MlflowClient

    from infra.retention import folder_bytes

    _check_name(name)
    cfg = _config(config)
    local = _local_root() / name
    with _with_services(cfg) as s3:
        objs, _ = _objects(s3, f"{name}/")
        mlc = MlflowClient()
        if not objs and not local.exists():
            # a removal whose MLflow step failed left runs tagged with the name: detach them, or say there is nothing
            runs, versions, gone_tag, _, _ = _detach_tracking(mlc, name, s3.bucket, set())
            if not runs and not versions:
                raise InputError(f"no campaign {name!r}: nothing under {local} nor s3://{s3.bucket}/{name}/ "
                                 "(`rao campaigns list` shows the campaigns)")
            console.print(f"campaign {name}: no files left; MLflow: {runs} runs and {versions} model versions "
                          f"detached from the name (tag rao.campaign {gone_tag})", highlight=False)
            return
        champs = _champions(s3.bucket).get(name, [])
        kept = [] if force else [k for _, _, k in champs]

        def protected(key: str) -> bool:
            return any(key.startswith(k + "/") or key == k + ".manifest.json" for k in kept)

        gone = [o for o in objs if not protected(o["Key"])]
        deleted = {o["Key"] for o in gone}
        # MLflow first: a failure here leaves the files, so the same command can be run again
        runs, versions, gone_tag, unaliased, pruned = _detach_tracking(mlc, name, s3.bucket, deleted)
        client = s3.client()
        for o in gone:
            client.delete_object(Bucket=s3.bucket, Key=o["Key"])
        local_bytes = folder_bytes(local)
        if local.exists():
            shutil.rmtree(local)
        for model, version in pruned:  # versions whose checkpoint is gone can no longer be loaded: the registry says so
            mlc.set_model_version_tag(model, version, "rao.pruned", "true")
    console.print(f"campaign {name}: freed {_mb(local_bytes)} local ({local}), "
                  f"{_mb(sum(o['Size'] for o in gone))} on S3 ({len(gone)} objects)", highlight=False)
    if runs or versions:
        console.print(f"MLflow: {runs} runs and {versions} model versions of {name} kept, detached from the "
                      f"name (tag rao.campaign {gone_tag})", highlight=False)
    if unaliased:
        console.print(f"aliases removed (their checkpoints are deleted): {', '.join(unaliased)}", highlight=False)
    for m, v, k in champs:
        if force:
            console.print(f"deleted the champion of {m} (version {v}, {k}): tagged rao.pruned", highlight=False)
        else:
            size = sum(o["Size"] for o in objs if protected(o["Key"]) and o["Key"].startswith(k))
            console.print(f"kept s3://{s3.bucket}/{k} ({_mb(size)}): the champion of {m} (version {v}); a new "
                          f"campaign {name} competes with it; --force deletes it too", highlight=False)


@app.command("fetch")
def fetch_cmd(
    name: str = typer.Argument(..., help="Campaign name (as `rao campaigns list` shows it)."),
    iteration: list[int] = typer.Option(None, "--iteration", help="Iteration whose checkpoint to fetch "
                                        "(repeatable); default: every checkpoint the campaign has on S3."),
    weights_only: bool = typer.Option(False, "--weights-only", help="Leave out the optimizer state (two thirds of "
                                      "a checkpoint; serving, evaluating and the studies need only the rest)."),
    config: str = typer.Option(None, "--config", help=_CONFIG_HELP),
) -> None:
    """Fetch a campaign's checkpoints from S3 back into its local folder (campaigns/NAME/checkpoints/iter-K, where
    its records name them), each object checked against its manifest's SHA-256; a folder already there stays."""
    import time

    from infra.retention import fetch_checkpoint, fetchable_iterations
    from infra.storage import ArtifactStore

    _check_name(name)
    cfg = _config(config)
    with _with_services(cfg) as s3:
        store = ArtifactStore(s3, name)
        have = fetchable_iterations(store)  # complete uploads only: what `list` shows
        if not have:
            raise InputError(f"campaign {name!r} has no checkpoint on s3://{s3.bucket}/{name}/ (`rao campaigns list` "
                             "shows the campaigns and their checkpoints)")
        want = list(dict.fromkeys(iteration or have))
        if missing := [k for k in want if k not in have]:
            raise InputError(f"campaign {name!r} has no checkpoint of iteration {missing[0]} on "
                             f"s3://{s3.bucket}/{name}/ (it has: {', '.join(f'iter-{k}' for k in have)}; "
                             "`rao campaigns list` shows them)")
        for k in want:
            dest, t0 = _local_root() / name / "checkpoints" / f"iter-{k}", time.monotonic()
            got = fetch_checkpoint(store, k, dest, optimizer=not weights_only)
            said = (f"fetched {_mb(got)} in {time.monotonic() - t0:.0f} s" if got else "already here")
            console.print(f"campaign {name} iter-{k}: {said} ({dest})", highlight=False)
