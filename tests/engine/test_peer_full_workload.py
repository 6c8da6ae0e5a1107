"""bench/hf_full_workload.py: transformers over the whole offline workload, batch by batch. Its
batching, the split of a run over two calls and the report, on the CPU with a tiny model."""

from __future__ import annotations

import json

import pytest

from bench.hf_full_workload import batch_indices, combine, main, summarize, warm_up_steps


def test_batches_cover_every_sequence_once_in_both_orders():
    output_lens = [5, 1, 9, 3, 7, 2, 8]
    prompt_lens = [10] * len(output_lens)
    assert batch_indices(prompt_lens, output_lens, 3, "arrival") == [[0, 1, 2], [3, 4, 5], [6]]
    by_output = batch_indices(prompt_lens, output_lens, 3, "by_output")
    assert by_output == [[1, 5, 3], [0, 4, 6], [2]]  # lengths 1 2 3 | 5 7 8 | 9
    with pytest.raises(ValueError, match="order must be one of"):
        batch_indices(prompt_lens, output_lens, 3, "random")


def test_arrival_closes_a_batch_before_its_padded_length_passes_vllms_cap():
    # vLLM's transformers baseline: a batch takes the next request only while its widest prompt plus
    # its longest output stay within 2,048 tokens (a request over it alone still runs, alone)
    prompt_lens = [1000, 1000, 1040, 500, 500, 2100, 10]
    output_lens = [1000, 1048, 100, 900, 1010, 10, 10]
    batches = batch_indices(prompt_lens, output_lens, 4, "arrival")
    # 0+1: 1000 + 1048 = 2048 fits; +2 would be 1040 + 1048; 2+3: 1040 + 900; +4: 1040 + 1010 > 2048
    assert batches == [[0, 1], [2, 3], [4], [5], [6]]


def test_arrival_batches_of_the_benchmark_workload_are_plain_runs_of_64():
    # so the arrival peer is vLLM's `benchmark_throughput.py --backend hf --hf-max-batch-size 64`
    from bench.offline_throughput import workload

    _, prompt_lens, output_lens = workload(128256, 256, 100, 1024, seed=0)
    batches = batch_indices(prompt_lens, output_lens, 64, "arrival")
    assert batches == [list(range(start, start + 64)) for start in range(0, 256, 64)]


def test_grouping_by_output_length_wastes_fewer_steps_on_the_benchmark_workload():
    from bench.offline_throughput import workload

    _, prompt_lens, output_lens = workload(128256, 256, 100, 1024, seed=0)

    def steps(order: str) -> int:  # a batch runs as many steps as its longest output
        return sum(max(output_lens[i] for i in b) for b in batch_indices(prompt_lens, output_lens, 64, order))

    assert steps("by_output") < 0.75 * steps("arrival")


def test_warm_up_meets_every_context_length_the_timed_batches_meet():
    prompt_lens = [30, 10, 20, 25]
    output_lens = [5, 40, 7, 3]
    batches = [[0, 1], [2, 3]]  # padded widths 30 and 25; contexts reach 30 + 40 and 25 + 7
    assert warm_up_steps(batches, prompt_lens, output_lens) == (1, 70 - 25)


def test_dry_run_split_over_two_calls_combines_into_the_whole_workload(tmp_path):
    first = main(["--dry-run", "--models", "Qwen3-0.6B", "--batches", "0", "--out", str(tmp_path / "a")])
    row = first["models"]["Qwen3-0.6B"]
    assert row["num_batches"] == 2 and [b["index"] for b in row["batches"]] == [0]
    assert row["summary"]["complete"] is False and "output_tok_s" not in row["summary"]

    # the engine's figure from the second call's run, as bench.offline_throughput writes it
    (tmp_path / "b").mkdir()
    engine = {"models": {"Qwen3-0.6B": {"output_tok_s": 1000.0}}}
    (tmp_path / "b" / "offline_throughput.json").write_text(json.dumps(engine))
    main(["--dry-run", "--models", "Qwen3-0.6B", "--batches", "1", "--out", str(tmp_path / "b")])

    parts = [str(tmp_path / run / "hf_full_workload.json") for run in ("a", "b")]
    merged = main(["--combine", *parts, "--out", str(tmp_path / "all")])
    summary = merged["models"]["Qwen3-0.6B"]["summary"]
    assert summary["complete"] and summary["useful_tokens"] == row["output_tokens"]
    assert summary["engine_x_peer"] == pytest.approx(1000.0 / summary["output_tok_s"])
    assert 0 < summary["useful_fraction"] <= 1
    report = (tmp_path / "all" / "hf_full_workload.md").read_text()
    assert "| Qwen3-0.6B | arrival | warm | 2/2 |" in report
    assert row["warm_up_s"] > 0

    # the engine ran in a call of its own: --engine's figure is the one the ratio takes
    engine_alone = tmp_path / "c" / "offline_throughput.json"
    engine_alone.parent.mkdir()
    engine_alone.write_text(json.dumps({"models": {"Qwen3-0.6B": {"output_tok_s": 2000.0}}}))
    again = main(["--combine", *parts, "--engine", str(engine_alone), "--out", str(tmp_path / "all_c")])
    assert again["models"]["Qwen3-0.6B"]["summary"]["engine_x_peer"] == pytest.approx(2000.0 / summary["output_tok_s"])

    with pytest.raises(ValueError, match="batch measured twice"):
        combine([merged["models"]["Qwen3-0.6B"], merged["models"]["Qwen3-0.6B"]])


def test_summary_refuses_batches_that_do_not_add_up_to_the_workload():
    row = {"model": "m", "num_batches": 1, "output_tokens": 10,
           "batches": [{"index": 0, "seqs": 2, "new_tokens": 4, "useful_tokens": 7, "s": 1.0}]}  # fmt: skip
    with pytest.raises(ValueError, match="batches hold 7 output tokens, the workload 10"):
        summarize(row, None)


def test_the_committed_whole_workload_peer_is_its_calls_combined(tmp_path):
    # the 2026-11-27 whole-workload figure came from four calls (the 8B peer in halves, its engine apart): the
    # committed result is what --combine makes of the committed parts, not a hand-edited file
    from pathlib import Path

    results = Path(__file__).resolve().parents[2] / "bench" / "results" / "h100"
    parts = ["qwen3_batches_0_2", "qwen3_batch_3", "llama8b_batches_0_1", "llama8b_batches_2_3"]
    engines = ["engine_qwen3", "engine_llama8b"]
    merged = main(["--combine", *[str(results / "hf_full_workload_parts" / f"{p}.json") for p in parts],
                   "--engine", *[str(results / "hf_full_workload_parts" / f"{e}.json") for e in engines],
                   "--out", str(tmp_path)])  # fmt: skip
    committed = json.loads((results / "hf_full_workload.json").read_text())
    assert merged["models"] == committed["models"]
    assert (tmp_path / "hf_full_workload.md").read_text() == (results / "hf_full_workload.md").read_text()
    assert {name: round(r["summary"]["engine_x_peer"], 1) for name, r in merged["models"].items()} == {
        "Qwen3-0.6B": 28.6, "Llama-3.1-8B": 22.5}  # fmt: skip


def test_combining_into_a_results_folder_keeps_the_engine_of_the_calls(tmp_path):
    # bench/results/<gpu>/ holds the canonical offline_throughput.json of another run: --engine's figure (the
    # engine measured on the peer's machine) is the one the ratio takes, not the folder's
    from pathlib import Path

    parts = Path(__file__).resolve().parents[2] / "bench" / "results" / "h100" / "hf_full_workload_parts"
    canonical = {"models": {"Qwen3-0.6B": {"output_tok_s": 1.0}, "Llama-3.1-8B": {"output_tok_s": 1.0}}}
    (tmp_path / "offline_throughput.json").write_text(json.dumps(canonical))
    merged = main(["--combine", *[str(parts / f"{p}.json") for p in ("qwen3_batches_0_2", "qwen3_batch_3")],
                   "--engine", str(parts / "engine_qwen3.json"), "--out", str(tmp_path)])  # fmt: skip
    summary = merged["models"]["Qwen3-0.6B"]["summary"]
    engine = json.loads((parts / "engine_qwen3.json").read_text())["models"]["Qwen3-0.6B"]["output_tok_s"]
    assert summary["engine_output_tok_s"] == engine and round(summary["engine_x_peer"], 1) == 28.6
