"""bench/prom.py: a /metrics scrape summed over label sets, or over those with given labels."""

from bench.prom import labelled, totals

TEXT = """# TYPE vllm:iteration_tokens_total histogram
vllm:iteration_tokens_total_bucket{le="+Inf",model_name="m"} 3.0
vllm:iteration_tokens_total_count{model_name="m"} 3.0
vllm:iteration_tokens_total_sum{model_name="m"} 5000.0
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{model_name="m",source="local_compute"} 400.0
vllm:prompt_tokens_by_source_total{model_name="m",source="local_cache_hit"} 64.0
"""


def test_totals_sum_every_label_set():
    sums = totals(TEXT)
    assert sums["vllm:iteration_tokens_total_sum"] == 5000.0
    assert sums["vllm:prompt_tokens_by_source_total"] == 464.0


def test_labelled_sums_only_the_label_sets_asked_for():
    assert labelled(TEXT, "vllm:prompt_tokens_by_source_total", source="local_compute") == 400.0
    assert labelled(TEXT, "vllm:prompt_tokens_by_source_total") == 464.0
    assert labelled(TEXT, "vllm:prompt_tokens_by_source_total", source="external") == 0.0
