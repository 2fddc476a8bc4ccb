"""The CPU core split of asynchronous RL (issue 40, item 4): serving.cpus binds the embedded vLLM server's threads,
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
