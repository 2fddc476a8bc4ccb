"""Serving metrics from vLLM's /metrics text, without a server.

The fixtures ``fixtures/vllm_metrics_{before,after}.txt`` are two /metrics snapshots in the exposition
vLLM 0.32 serves: written by ``prometheus_client.generate_latest`` (the library vLLM serves them with) from
metrics declared with vLLM's names, types, label names and buckets (``vllm/v1/metrics/loggers.py``), with
known values: over the stage 12000 generated and 40000 prompt tokens, 30000 of 40000 queried prefix tokens
hit, 5 preemptions, 100 finished requests that queued 0.5 s, waited 1.0 s for the first token, spent 0.3 s
in prefill and 4.0 s in decode each. (No vLLM server may run in this test suite; replace them with a real
capture when one is at hand: ``curl http://127.0.0.1:PORT/metrics``.)
"""

from pathlib import Path

import httpx
import pytest

from infra.vllm_metrics import metrics_url, parse_metrics, scrape, serving_delta

FIX = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="module")
def snapshots() -> tuple[str, str]:
    return (FIX / "vllm_metrics_before.txt").read_text(), (FIX / "vllm_metrics_after.txt").read_text()


def test_parse_sums_counters_and_histograms(snapshots):
    after = parse_metrics(snapshots[1])
    assert after["vllm:generation_tokens_total"] == 30000
    assert after["vllm:prompt_tokens_total"] == 92000
    assert after["vllm:prefix_cache_hits_total"] == 61000 and after["vllm:prefix_cache_queries_total"] == 92000
    assert after["vllm:num_preemptions_total"] == 7
    assert after["vllm:request_success_total"] == 420  # summed over finished_reason labels
    assert after["vllm:request_queue_time_seconds_count"] == 110
    assert after["vllm:request_queue_time_seconds_sum"] == pytest.approx(10 * 0.1 + 100 * 0.5)
    assert "vllm:num_requests_running" not in after  # gauges are not read


def test_delta_over_the_stage(snapshots):
    before, after = (parse_metrics(t) for t in snapshots)
    d = serving_delta(before, after, wall_s=60.0)
    assert d["generation_tokens"] == 12000 and d["generation_tokens_per_s"] == pytest.approx(200.0)
    assert d["prompt_tokens"] == 40000 and d["prompt_tokens_per_s"] == pytest.approx(40000 / 60)
    assert d["prefix_cache_hit_rate"] == pytest.approx(0.75)
    assert d["preemptions"] == 5 and d["requests"] == 100
    assert d["queue_time_mean_s"] == pytest.approx(0.5)
    assert d["ttft_mean_s"] == pytest.approx(1.0)
    assert d["prefill_time_mean_s"] == pytest.approx(0.3)
    assert d["decode_time_mean_s"] == pytest.approx(4.0)


def test_delta_edge_cases(snapshots):
    before, after = (parse_metrics(t) for t in snapshots)
    assert serving_delta(after, before, 60.0) == {}  # counters went down: the server restarted in between
    assert serving_delta(None, after, 60.0) == {} and serving_delta(before, None, 60.0) == {}
    same = serving_delta(before, before, 0.0)  # nothing happened: no ratios, no rates
    assert same == {"generation_tokens": 0.0, "prompt_tokens": 0.0, "preemptions": 0.0, "requests": 0.0}
    with pytest.raises(ValueError):
        parse_metrics("vllm:generation_tokens_total{engine=0} not-a-number\n")


def test_scrape(snapshots, monkeypatch):
    assert metrics_url("http://127.0.0.1:8000/v1") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://h:1/v1/") == "http://h:1/metrics" and metrics_url("http://h:1") == "http://h:1/metrics"
    seen = []

    def fake_get(url, timeout):
        seen.append(url)
        return httpx.Response(200, text=snapshots[1], request=httpx.Request("GET", url))

    monkeypatch.setattr(httpx, "get", fake_get)
    assert scrape("http://127.0.0.1:8000/v1")["vllm:generation_tokens_total"] == 30000
    assert seen == ["http://127.0.0.1:8000/metrics"]
    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(404, request=httpx.Request("GET", url)))
    assert scrape("http://127.0.0.1:8000/v1") is None  # a server without /metrics: no serving metrics, no error


@pytest.mark.vllm
async def test_served_model_exports_the_stage_metrics(vllm_tiny):
    """The server as the project starts it exports vLLM's counters: a server started with
    ``--disable-log-stats`` serves /metrics without any ``vllm:*`` series, and every campaign then logged
    no ``serving/*`` metric at all."""
    from rao_core.policies.base import PolicyRequest
    from rao_core.policies.openai_policy import OpenAIPolicy
    from rao_core.tree import Node

    before = scrape(vllm_tiny.base_url)
    pol = OpenAIPolicy(vllm_tiny.base_url, vllm_tiny.model, stop=[], extra_body={"ignore_eos": True})
    try:
        gen = await pol.generate(PolicyRequest(node=Node(node_id="0", depth=0, goal="g"), env="test",
                                               prompt_token_ids=[1, 520, 3412, 28], max_tokens=7))
    finally:
        await pol.aclose()
    delta = serving_delta(before, scrape(vllm_tiny.base_url), wall_s=1.0)
    assert len(gen.token_ids) == 7
    assert delta["generation_tokens"] == 7 and delta["prompt_tokens"] == 4 and delta["requests"] == 1
