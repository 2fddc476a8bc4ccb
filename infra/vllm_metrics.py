"""Serving metrics of one stage, from vLLM's Prometheus ``/metrics`` endpoint.

The campaign's generate stage reads ``/metrics`` before and after the rollouts (:func:`scrape`) and logs the
difference (:func:`serving_delta`) with the iteration's metrics as ``serving/<name>``, so that a slow iteration
says why (little prefill reuse, preemptions, requests queueing, ...). Names read: vLLM 0.32's
(``vllm/v1/metrics/loggers.py``), summed over label sets; a pool of replicas is summed over the replicas read at
both ends (:func:`pool_delta`). A value that cannot be trusted (a missing metric, a denominator that did not grow,
a server restart between the reads) is left out, never 0. Docs: docs/pipeline/artifacts.md (``serving/*``).
"""

from __future__ import annotations

import math

__all__ = ["metrics_url", "parse_metrics", "pool_delta", "scrape", "serving_delta"]

# sample names summed over their label sets
_COUNTERS = {
    "generation_tokens": "vllm:generation_tokens_total",
    "prompt_tokens": "vllm:prompt_tokens_total",
    "prefix_cache_queries": "vllm:prefix_cache_queries_total",
    "prefix_cache_hits": "vllm:prefix_cache_hits_total",
    "preemptions": "vllm:num_preemptions_total",
    "requests": "vllm:request_success_total",
}
_HISTOGRAMS = {  # serving/<key>_mean_s = d(sum) / d(count)
    "queue_time": "vllm:request_queue_time_seconds",
    "ttft": "vllm:time_to_first_token_seconds",
    "prefill_time": "vllm:request_prefill_time_seconds",
    "decode_time": "vllm:request_decode_time_seconds",
}


def parse_metrics(text: str) -> dict[str, float]:
    """Totals of the sample names this module reads, from Prometheus text exposition ``text``.

    Returns ``{sample name: value summed over label sets}`` for the counters' ``_total`` samples and the
    histograms' ``_sum``/``_count`` samples of :func:`serving_delta`'s table (absent names are absent).

    Raises:
        ValueError: ``text`` is not Prometheus text format.
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(_COUNTERS.values()) | {f"{h}{s}" for h in _HISTOGRAMS.values() for s in ("_sum", "_count")}
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in wanted and math.isfinite(sample.value):
                out[sample.name] = out.get(sample.name, 0.0) + float(sample.value)
    return out


def metrics_url(base_url: str) -> str:
    """``/metrics`` of the server whose OpenAI base URL is ``base_url`` (``http://h:p/v1`` -> ``http://h:p/metrics``)."""
    root = base_url.rstrip("/")
    root = root.removesuffix("/v1")
    return f"{root}/metrics"


def scrape(base_url: str, timeout_s: float = 5.0) -> dict[str, float] | None:
    """:func:`parse_metrics` of the server's ``/metrics``, or None when it cannot be read (an external
    server without the endpoint, a network error): serving metrics are diagnostics, never a failure."""
    import httpx

    try:
        r = httpx.get(metrics_url(base_url), timeout=timeout_s)
        r.raise_for_status()
        return parse_metrics(r.text)
    except (httpx.HTTPError, ValueError):
        return None


def serving_delta(before: dict[str, float] | None, after: dict[str, float] | None, wall_s: float
                  ) -> dict[str, float]:
    """The stage's serving metrics (keys without ``serving/``). Counters are exposed with a ``_total`` suffix,
    histograms as ``_sum``/``_count``:

    | ``serving/...`` | from | meaning |
    |---|---|---|
    | ``generation_tokens``, ``generation_tokens_per_s`` | ``vllm:generation_tokens_total`` | tokens generated over the stage; per second of the stage's wall time |
    | ``prompt_tokens``, ``prompt_tokens_per_s`` | ``vllm:prompt_tokens_total`` | prefill (prompt) tokens processed, cached ones included; per second |
    | ``prefix_cache_hit_rate`` | ``vllm:prefix_cache_hits_total`` / ``vllm:prefix_cache_queries_total`` | share of queried prompt tokens found in the prefix cache |
    | ``preemptions`` | ``vllm:num_preemptions_total`` | requests preempted (KV cache full) |
    | ``requests`` | ``vllm:request_success_total`` | requests finished |
    | ``queue_time_mean_s`` | ``vllm:request_queue_time_seconds`` | mean time a request waited before being scheduled |
    | ``ttft_mean_s`` | ``vllm:time_to_first_token_seconds`` | mean time to first token |
    | ``prefill_time_mean_s``, ``decode_time_mean_s`` | ``vllm:request_prefill_time_seconds``, ``..._decode_...`` | mean per-request prefill / decode time |

    A ratio or mean whose denominator did not grow is left out (not 0); a metric the server does not export is
    left out; a counter that went down (a server restart between the two reads) makes the difference meaningless,
    so nothing is reported.

    Args:
        before, after: :func:`parse_metrics` (or :func:`scrape`) results at the start and end of the stage;
            None (unreadable) gives ``{}``.
        wall_s: the stage's wall time in seconds (the rates' denominator); <= 0 leaves the rates out.

    Returns:
        ``{name: value}``; empty when either read is missing or a counter went down (server restarted).
    """
    if before is None or after is None:
        return {}
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    if any(v < 0 for v in d.values()):
        return {}
    out: dict[str, float] = {}
    for key in ("generation_tokens", "prompt_tokens"):
        name = _COUNTERS[key]
        if name in d:
            out[key] = d[name]
            if wall_s > 0:
                out[f"{key}_per_s"] = d[name] / wall_s
    for key in ("preemptions", "requests"):
        if _COUNTERS[key] in d:
            out[key] = d[_COUNTERS[key]]
    queries, hits = d.get(_COUNTERS["prefix_cache_queries"], 0.0), d.get(_COUNTERS["prefix_cache_hits"])
    if queries > 0 and hits is not None:
        out["prefix_cache_hit_rate"] = hits / queries
    for key, name in _HISTOGRAMS.items():
        n = d.get(f"{name}_count", 0.0)
        if n > 0 and f"{name}_sum" in d:
            out[f"{key}_mean_s"] = d[f"{name}_sum"] / n
    return out


def pool_delta(before: list[dict[str, float] | None], after: list[dict[str, float] | None], wall_s: float
               ) -> dict[str, float]:
    """:func:`serving_delta` of a pool of replicas: ``before[i]`` and ``after[i]`` are replica i's reads (in the
    same order). Counters are summed over the replicas readable at both ends (a replica lost during the stage
    is left out); with more than one replica, ``replica<i>_requests`` is each such replica's finished requests.
    One replica: exactly :func:`serving_delta` of its reads."""
    if len(before) != len(after):
        raise ValueError(f"pool_delta: {len(before)} reads before, {len(after)} after")
    if len(before) == 1:
        return serving_delta(before[0], after[0], wall_s)
    pairs = [(i, b, a) for i, (b, a) in enumerate(zip(before, after)) if b is not None and a is not None]
    if not pairs:
        return {}

    def total(reads: list[dict[str, float]]) -> dict[str, float]:
        out: dict[str, float] = {}
        for r in reads:
            for k, v in r.items():
                out[k] = out.get(k, 0.0) + v
        return out

    out = serving_delta(total([b for _, b, _ in pairs]), total([a for _, _, a in pairs]), wall_s)
    for i, b, a in pairs:
        d = serving_delta(b, a, wall_s)
        if "requests" in d:
            out[f"replica{i}_requests"] = d["requests"]
    return out
