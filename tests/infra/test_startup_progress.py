"""No silent start: a starting vLLM server's phases come from its log, with a line at least
every ``heartbeat_s`` between them, and its compile cache lives under ``$RAO_HOME``. No server is started."""

from __future__ import annotations

from pathlib import Path


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_phases_are_read_from_the_log_once_each_with_a_heartbeat_between_them(tmp_path):
    from infra.serving import StartupWatch

    log = tmp_path / "vllm-1.log"
    log.write_text("INFO Loading weights took 9.00 seconds\n")  # an earlier start's lines: not this one's
    clock, lines = Clock(), []
    watch = StartupWatch(log, lines.append, pid=lambda: 4242, clock=clock, heartbeat_s=20.0)
    watch.poll()
    assert lines == [f"vLLM start: process up (pid 4242), log {log}"]
    with log.open("a") as f:
        f.write("INFO 12-02 [core.py:134] Initializing a V1 LLM engine (v0.32.0) with config: ...\n"
                "INFO 12-02 [cpu_model_runner.py:68] Starting to load model /x/served...\n")
    clock.t += 4
    watch.poll()
    assert lines[1:] == ["vLLM start: engine configured (4 s)", "vLLM start: loading weights (4 s)"]
    clock.t += 19  # 19 s since the last line: nothing yet
    watch.poll()
    assert len(lines) == 3
    clock.t += 2
    watch.poll()
    assert lines[3] == ("vLLM start: still starting, 25 s, after loading weights; its last log line: "
                        "INFO [cpu_model_runner.py:68] Starting to load model /x/served...")
    with log.open("a") as f:  # the same phase twice is reported once; a half-written line waits
        f.write("INFO [default_loader.py:502] Loading weights took 3.10 seconds\n"
                "INFO [monitor.py:40] Starting torch.compile\nINFO [monitor.py:60] Starting torch.compile\n"
                "INFO [monitor.py:66] torch.compile took 81.")
    clock.t += 95
    watch.poll()
    assert lines[4:] == ["vLLM start: weights loaded (120 s)", "vLLM start: compiling (torch.compile) (120 s)"]
    with log.open("a") as f:
        f.write("20 s in total\nINFO [core.py:403] init engine (profile, create kv cache, warmup model) took 30.1 s\n"
                "INFO [entry.py:140] Starting vLLM server on http://127.0.0.1:1\n")
    clock.t += 10
    phases = watch.ready()
    assert lines[6:9] == ["vLLM start: compiled (130 s)", "vLLM start: engine ready (KV cache allocated, warmed up) "
                          "(130 s)", "vLLM start: HTTP server up (130 s)"]
    assert lines[9].startswith("vLLM start: ready after 130 s (process up 0 s, engine configured 4 s, ")
    assert phases == {"process up": 0.0, "engine configured": 4.0, "loading weights": 4.0, "weights loaded": 120.0,
                      "compiling (torch.compile)": 120.0, "compiled": 130.0,
                      "engine ready (KV cache allocated, warmed up)": 130.0, "HTTP server up": 130.0, "ready": 130.0}


def test_a_quoted_log_line_loses_its_date_and_is_cut_between_words():
    from infra.serving import log_excerpt

    line = ("(EngineCore_DP0 pid=812) WARNING 12-05 23:25:01 [shm_broadcast.py:466] No available shared memory "
            "broadcast block found in 60 seconds. This typically happens when some processes are hanging or doing "
            "some time-consuming work (e.g. compilation, weight/kv cache loading).")
    short = log_excerpt(line)
    assert short.startswith("WARNING [shm_broadcast.py:466] No available shared memory broadcast block found")
    assert len(short) <= 160 and short.endswith(" ...")
    assert short.removesuffix(" ...").split()[-1] in line.split()  # a whole word before the cut, never half of one
    assert log_excerpt("INFO 12-02 [core.py:1] short line") == "INFO [core.py:1] short line"
    assert log_excerpt("no prefix at all") == "no prefix at all"


def test_a_log_with_no_known_phase_still_gets_a_line_every_heartbeat(tmp_path):
    from infra.serving import StartupWatch

    clock, lines = Clock(), []
    watch = StartupWatch(tmp_path / "absent.log", lines.append, clock=clock, heartbeat_s=20.0)
    for _ in range(13):  # 65 s in 5 s polls, no log file at all
        watch.poll()
        clock.t += 5
    assert [x.split(",")[0] for x in lines] == ["vLLM start: process up"] + ["vLLM start: still starting"] * 3
    assert lines[1] == "vLLM start: still starting, 20 s, after process up"


def test_the_compile_cache_is_under_rao_home_unless_the_caller_chose_one(tmp_path, monkeypatch):
    from infra.serving import VLLMServer

    monkeypatch.setenv("RAO_HOME", str(tmp_path))
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    srv = VLLMServer(tmp_path / "model", on_gpu=False)
    assert srv._env()["VLLM_CACHE_ROOT"] == str(Path(tmp_path) / "cache" / "vllm")
    monkeypatch.setenv("VLLM_CACHE_ROOT", "/elsewhere/vllm")
    assert srv._env()["VLLM_CACHE_ROOT"] == "/elsewhere/vllm"
