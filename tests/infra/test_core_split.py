"""The CPU core split of asynchronous RL: serving.cpus binds the embedded vLLM server's threads,
trainer.cpus the training child's process, so generation and training can run at once on separate cores."""

from pathlib import Path

from infra.serving import server_from_config
from rao_core.config import load_config
from rao_core.train.launch import launch_command


def test_serving_cpus_bind_the_server_and_are_shared_by_replicas():
    one = server_from_config(load_config("configs/cpu-smoke.yaml", {"serving.cpus": [1]}), "m", on_gpu=False)
    assert one.cpus == [1] and one._env()["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    cfg = load_config("configs/cpu-smoke.yaml", {"serving.cpus": [2, 3, 5], "serving.replicas": 2})
    assert [server_from_config(cfg, "m", on_gpu=False, replica=r).cpus for r in (0, 1)] == [[2, 3], [5]]
    assert server_from_config(load_config("configs/cpu-smoke.yaml"), "m", on_gpu=False).cpus == []  # every core
    assert server_from_config(load_config("configs/cpu-smoke.yaml", {"serving.cpus": [1]}), "m",
                              on_gpu=True).cpus == []  # unused on GPUs


def test_trainer_cpus_put_the_training_child_behind_taskset_with_one_thread_per_core():
    args = dict(iteration=2, max_staleness=1)
    cmd = launch_command(Path("s"), Path("m"), Path("o"), Path("c"), Path("j"), cpus=[0, 2], **args)
    assert cmd[:3] == ["taskset", "-c", "0,2"]
    assert cmd[cmd.index("--num_cpu_threads_per_process") + 1] == "2"
    assert cmd[-2:] == ["--max-staleness", "1"]
    plain = launch_command(Path("s"), Path("m"), Path("o"), Path("c"), Path("j"), iteration=2)
    assert "taskset" not in plain and "--max-staleness" not in plain


def _bench():
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_async", Path(__file__).resolve().parents[2] / "scripts"
                                                  / "bench_async.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_async_benchmark_reads_iterations_and_steps_from_a_campaign_timeline():
    bench = _bench()
    sync = {"timeline": {"rows": [{"stage": "warm start", "s": 300.0}, {"stage": "iteration 1", "s": 200.0},
                                  {"stage": "retention after iteration 1", "s": 1.0},
                                  {"stage": "iteration 2", "s": 180.0}, {"stage": "iteration 3", "s": 170.0},
                                  {"stage": "iteration 4", "s": 190.0}]}}
    assert bench.per_iteration_seconds(sync, 4) == {"median_s": 180.0, "total_s": 741.0}
    steps = {"timeline": {"rows": [{"stage": "step 1 (train 1 + generate 2)", "s": 150.0},
                                   {"stage": "step 2 (train 2 + evaluate 1 + generate 3)", "s": 120.0},
                                   {"stage": "retention after iteration 1", "s": 2.0},
                                   {"stage": "step 3 (train 3 + evaluate 2 + generate 4)", "s": 110.0},
                                   {"stage": "step 4 (train 4 + evaluate 3)", "s": 100.0},
                                   {"stage": "step 5 (evaluate 4)", "s": 30.0}]}}
    # steps 2 and 3 hold a training, an evaluation and a generation each, as an iteration does; step 4 (no
    # generation) would pull the median down
    assert bench.per_iteration_seconds(steps, 4) == {"median_s": 115.0, "total_s": 512.0}
    assert bench.mode_overrides("async-split", [1], [0]) == ["serving.cpus=[1]", "trainer.cpus=[0]",
                                                             "algo.max_staleness=1"]
    assert bench.mode_overrides("sync", [1], [0]) == []


def test_the_async_benchmark_measures_core_use_over_the_rl_iterations():
    """Core use over the RL iterations only (the warm start and the base evaluation before them dilute the
    overlap): the window from the timeline, and the busy share of the samples inside it, by hand."""
    bench = _bench()
    sync = {"timeline": {"start": 1000.0, "rows": [{"stage": "warm start", "s": 300.0},
                                                   {"stage": "iteration 1", "s": 200.0},
                                                   {"stage": "retention after iteration 1", "s": 1.0},
                                                   {"stage": "iteration 2", "s": 180.0},
                                                   {"stage": "end-of-run summary", "s": 5.0}]}}
    assert bench.rl_window(sync) == (1300.0, 1681.0)
    assert bench.rl_window({"timeline": {"start": 0.0, "rows": [{"stage": "warm start", "s": 1.0}]}}) is None

    def reading(busy: int, idle: int) -> dict[str, list[int]]:  # user nice system idle iowait
        return {"cpu0": [busy, 0, 0, idle, 0]}

    sampler = bench.CoreSampler()
    # before the window: idle; inside it (1300-1681): 3 of every 4 jiffies busy
    sampler.samples = [(1000.0, reading(0, 0)), (1299.5, reading(10, 290)), (1500.0, reading(160, 340)),
                       (1681.0, reading(310, 390))]
    assert sampler.busy_between(1300.0, 1681.0) == {"cpu0": 0.75}
    assert sampler.busy(sampler.samples[0][1], sampler.samples[-1][1]) == {"cpu0": round(310 / 700, 3)}
    assert sampler.busy_between(5000.0, 6000.0) is None


def _campaign(median_s: float) -> dict:
    return {"median_s": median_s, "total_s": 3 * median_s, "wall_s": 4 * median_s, "cores": {}, "rl_cores": None}


def test_the_async_benchmark_resumes_by_repeat_and_takes_its_ratios_within_one(tmp_path, capsys):
    """scripts/bench_async.py --out (~140 min, more than a sitting): finished repeats are kept,
    an unfinished repeat keeps its campaigns on the same machine and boot only (its ratios must come from one
    machine), and the ratios are per finished repeat."""
    import argparse

    bench = _bench()
    args = argparse.Namespace(iterations=4, serving_cpus=[1], trainer_cpus=[0], out=str(tmp_path / "a.json"))
    here, other = {"host": "h", "boot": "b1"}, {"host": "h", "boot": "b0"}
    record = bench.load_record(args.out, args)
    assert bench.pending(record, 2, here) == [(0, "sync"), (0, "sync-split"), (0, "async-split"),
                                              (1, "sync-split"), (1, "async-split"), (1, "sync")]
    record["repeats"][0]["runs"] = {"sync": _campaign(200.0), "sync-split": _campaign(220.0),
                                    "async-split": _campaign(132.0)}
    record["repeats"][1]["runs"] = {"sync-split": _campaign(230.0)}
    bench.write_record(args.out, record)
    again = bench.load_record(args.out, args)
    # the same boot: only repeat 1's last two campaigns are left
    assert bench.pending(again, 2, here) == [(1, "async-split"), (1, "sync")]
    # another boot: repeat 1 starts again (said), repeat 0 is kept; a third repeat is added
    again = bench.load_record(args.out, args)
    assert bench.pending(again, 3, other) == [(1, "sync-split"), (1, "async-split"), (1, "sync"),
                                              (2, "async-split"), (2, "sync"), (2, "sync-split")]
    assert "repeat 1: its 1 campaign(s) ran on another machine or boot" in capsys.readouterr().out
    assert again["repeats"][1]["runs"] == {} and again["repeats"][1]["boot"] == "b0"
    s = bench.summarise(record)  # repeat 1 unfinished: no ratio from it, its campaign still in the mode's spread
    assert s["ratios"] == [{"repeat": 0, "async_over_sync": 0.66, "async_over_sync_split": 0.6}]
    assert s["per_mode_s"]["sync-split"] == {"min": 220.0, "median": 225.0, "max": 230.0}
    assert s["async_over_sync_split"] == {"min": 0.6, "median": 0.6, "max": 0.6}


def test_the_async_benchmark_refuses_an_out_file_of_other_settings(tmp_path):
    import argparse

    import pytest

    bench = _bench()
    out = tmp_path / "a.json"
    args = argparse.Namespace(iterations=4, serving_cpus=[1], trainer_cpus=[0], out=str(out))
    bench.write_record(str(out), {"settings": {**bench.settings(args), "iterations": 3}, "repeats": []})
    with pytest.raises(SystemExit) as e:
        bench.load_record(str(out), args)
    assert str(e.value).startswith(f"error: --out {out} holds campaigns of other settings") and "\n" not in str(e.value)
    out.write_text("[1, 2]")
    with pytest.raises(SystemExit) as e:
        bench.load_record(str(out), args)
    assert str(e.value).startswith(f"error: --out {out}: not a record of this script")


def test_a_failed_benchmark_campaign_is_one_error_line_naming_its_kept_output(tmp_path, monkeypatch, capsys):
    """scripts/bench_async.py: each campaign's output goes to $RAO_HOME/logs/<name>.log while it runs (its
    progress, printed as a `tail -f` line); a campaign that fails exits with its last line and the log's path."""
    import argparse
    import subprocess

    import pytest

    bench = _bench()
    monkeypatch.setenv("RAO_HOME", str(tmp_path))

    def failing_run(cmd, cwd, stdout, stderr, text):
        stdout.write("iteration 1: generate\nerror: vLLM did not start\n\n")
        return subprocess.CompletedProcess(cmd, 1)

    monkeypatch.setattr(bench.subprocess, "run", failing_run)
    args = argparse.Namespace(iterations=4, serving_cpus=[1], trainer_cpus=[0], dry_run=False)
    log = tmp_path / "logs" / "b-sync-r0.log"
    with pytest.raises(SystemExit) as e:
        bench.run_campaign("b-sync-r0", "sync", args)
    assert str(e.value) == f"error: b-sync-r0 exited 1: error: vLLM did not start (whole output: {log})"
    assert log.read_text().startswith("iteration 1: generate") and f"tail -f {log}" in capsys.readouterr().out
