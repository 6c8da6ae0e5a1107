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
