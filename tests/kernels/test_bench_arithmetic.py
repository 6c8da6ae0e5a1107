"""The kernel benchmark's floors (bytes and FLOPs per call) and its report, checked without a GPU."""

from __future__ import annotations

from bench.kernel_math import check_arithmetic, decode_kv_bytes, prefill_flops
from bench.kernels import PREFILL_SEQ_LENS, _markdown


def test_hand_computed_floors():
    check_arithmetic()


def test_prefill_workload_is_16k_tokens_at_every_length():
    for seq_len in PREFILL_SEQ_LENS:
        batch = 16384 // seq_len
        assert batch * seq_len == 16384
        # causal FLOPs grow with S at a fixed token count: B * 2 * S^2 * D * H = 16k * 2 * S * D * H
        assert prefill_flops(batch, seq_len, 32, 128) == 16384 * 2 * seq_len * 128 * 32


def test_decode_bytes_count_k_and_v_of_every_context_token():
    assert decode_kv_bytes(256, 1024, 8, 128, 2) == 2 * 256 * 1024 * 8 * 128 * 2 == 2**30


def test_report_renders_present_and_missing_figures():
    results = {
        "meta": {"date": "d", "gpu": "g", "torch": "t", "triton": "tr", "python": "p"},
        "ceilings": {"copy_gbps": 3000.0, "read_gbps": 3050.0, "matmul_tflops": 776.0, "matmul_n": 8192},
        "decode": [{"B": 1, "L": 4096, "splits": 33, "inferq_us": 20.5, "inferq_gbps": 818.0,
                    "inferq_frac_read_bw": 0.268, "sdpa_flash_error": "no kernel"}],
    }  # fmt: skip
    report = _markdown(results)
    assert "| B | L | splits | inferq us | inferq GB/s | of read BW |\n" in report  # no peer figure: no peer column
    assert "| 1 | 4096 | 33 | 20.5 | 818 | 27% |" in report
    assert "decode: sdpa_flash_error: no kernel" in report


def test_graph_timeline_charges_overlap_once_and_gaps_to_the_kernel_after():
    from bench.step_profiles import stream_events, timeline_shares

    trace = {"traceEvents": [
        {"ph": "X", "cat": "kernel", "name": "gemv", "ts": 0.0, "dur": 10.0},
        {"ph": "X", "cat": "kernel", "name": "attn", "ts": 8.0, "dur": 5.0},  # under gemv's tail (PDL): adds 3
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 99.0},  # host side: not counted
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 20.0, "dur": 2.0},  # after a 7 us gap
        {"ph": "X", "cat": "kernel", "name": "gemv", "ts": 22.5, "dur": 4.0},  # 0.5 us launch gap
    ]}  # fmt: skip
    shares = timeline_shares(stream_events(trace), num_steps=1)
    assert shares["span_us_per_step"] == 26.5
    assert shares["idle_us_per_step"] == 7.5
    assert shares["busy_us_per_step"] == 19.0
    assert shares["gaps_over_5us_per_step"] == 1
    # [calls, us inside, marginal us, gap-before us]
    assert shares["kernels"]["gemv"] == [2, 14.0, 14.0, 0.5]
    assert shares["kernels"]["attn"] == [1, 5.0, 3.0, 0.0]
    assert shares["kernels"]["Memcpy HtoD"] == [1, 2.0, 2.0, 7.0]
    assert timeline_shares([], 1)["error"].startswith("the profile holds no GPU events")
