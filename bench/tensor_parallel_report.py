"""The markdown report of bench/tensor_parallel.py: batch-1 decode, offline throughput and the all-reduce's cost
by tensor-parallel size."""

from __future__ import annotations


def _goal(row: dict) -> str | None:
    goal = row.get("goal")
    if not goal:
        return None
    label = {"ratio_to_size_1": "x TP 1", "frac_of_floor": "of floor"}[goal["figure"]]
    verdict = {True: "met", False: "missed", None: "unmeasured"}[goal["met"]]
    bound = f"{goal['bound']:.0%}" if goal["figure"] == "frac_of_floor" else f"{goal['bound']:g}"
    return f"{label} {goal['sense']} {bound}: {verdict}"


def _engine_rows(results: dict) -> tuple[list[dict], list[dict]]:
    decode, offline = [], []
    for name, model in results["models"].items():
        for size, row in model["sizes"].items():
            if "error" in row:
                decode.append({"model": name, "tp": size, "note": f"error: {row['error'][:120]}"})
                continue
            d, o, share = row["decode"], row["offline"], row.get("all_reduce_per_step") or {}
            decode.append({"model": name, "tp": size, "ms": d["ms_per_token"], "floor": d["floor_ms_per_token"],
                           "frac": d["frac_of_floor"], "ratio": row.get("ratio_to_size_1"),
                           "gb": d["rank0_bytes_per_token"] / 1e9, "step": d["step_ms_median"],
                           "gpu": d["gpu_ms_median"], "host": d["host_ms_median"], "ttft": d["ttft_ms"],
                           "ar_ms": share.get("ms_per_step"), "ar_share": share.get("share_of_ms_per_token"),
                           "note": _goal(row)})  # fmt: skip
            offline.append({"model": name, "tp": size, "out": o["output_tok_s"], "total": o["total_tok_s"],
                            "s": o["elapsed_s"], "ratio": row.get("offline_ratio_to_size_1"),
                            "frac": o["frac_of_rank0_roofline"], "steps": o["steps"], "pre": o["preemptions"],
                            "pool": row["kv_pool_tokens"]})  # fmt: skip
    return decode, offline


def _all_reduce_rows(results: dict) -> tuple[list[dict], list[dict]]:
    messages, bus = [], []
    for size, result in results["all_reduce"].items():
        if "error" in result:
            bus.append({"tp": size, "note": f"error: {result['error'][:120]}"})
            continue
        for m in result["messages"]:
            messages.append({"tp": size, "shape": f"[{m['rows']}, {m['hidden']}]", "bytes": m["bytes"],
                             "eager": m["us_eager"], "graph": m.get("us_graph")})  # fmt: skip
        b = result["bus"]
        note = f"{result['backend']} {result.get('nccl_version') or ''}".strip()
        bus.append({"tp": size, "mib": b["bytes"] / 2**20, "us": b["us"], "alg": b["algbw_gbps"],
                    "bus": b["busbw_gbps"], "note": note})  # fmt: skip
    return messages, bus


def markdown(results: dict) -> str:
    from bench import decode_latency
    from bench.engine_common import header
    from bench.report import table
    from bench.tensor_parallel import MAX_LEN, MAX_NUM_BATCHED_TOKENS, MIN_LEN, NEW_TOKENS, OFFLINE_SEQS

    decode, offline = _engine_rows(results)
    messages, bus = _all_reduce_rows(results)
    meta = results["meta"]
    parts = header(results, "inferq tensor parallelism: batch-1 decode, offline throughput, all-reduce") + [
        "",
        f"GPUs seen: {meta['gpus']}; NCCL_NVLS_ENABLE={meta['nccl_nvls_enable']}; sizes run: "
        f"{', '.join(map(str, results['sizes'])) or 'none'}. Random bf16 weights (load_format dummy), CUDA "
        "graphs, one engine a size (rank r on cuda:r), closed before the next. Read bandwidth and matmul rate "
        "measured on cuda:0 stand for every rank's GPU.",
    ]
    parts += [f"- Size {size} skipped: {why}." for size, why in results["skipped_sizes"].items()]
    parts += [
        "",
        "## Batch-1 decode",
        "",
        f"{decode_latency.PROMPT_LEN}-token prompt, {NEW_TOKENS} new greedy tokens, ignore_eos "
        "(bench/decode_latency.py's measurement). Floor: the bytes rank 0 streams a token (its shard of the weights, "
        "the whole LM head, its KV heads' K/V at the mean context: 'rank 0 GB') over the read bandwidth. "
        "x TP 1: ms/token over size 1's. All-reduce ms: a step's 2 L + 1 all-reduces of [1, H] at the measured "
        "time of one (its graph replay; launched from Python where no graph ran), and their share of the "
        "ms/token. Step, GPU and host ms: medians per step (GPU and host: rank 0's step timer).",
        "",
        table(
            decode,
            [
                ("model", "model", ""),
                ("tp", "TP", ""),
                ("ms", "ms/token", ".3f"),
                ("floor", "floor ms", ".3f"),
                ("frac", "of floor", ".0%"),
                ("ratio", "x TP 1", ".2f"),
                ("gb", "rank 0 GB", ".2f"),
                ("ar_ms", "all-reduce ms", ".3f"),
                ("ar_share", "all-reduce share", ".0%"),
                ("step", "step ms", ".3f"),
                ("gpu", "GPU ms", ".3f"),
                ("host", "host ms", ".3f"),
                ("ttft", "TTFT ms", ".2f"),
                ("note", "goal or note", ""),
            ],
            drop_absent=True,
        ),
        "",
        "## Offline throughput",
        "",
        f"Seed 0, {OFFLINE_SEQS} sequences, prompt and output lengths uniform in [{MIN_LEN}, {MAX_LEN}], random "
        f"token ids, ignore_eos, greedy; max_num_seqs {OFFLINE_SEQS}, max_num_batched_tokens "
        f"{MAX_NUM_BATCHED_TOKENS}, a KV pool that holds every sequence at once. x TP 1: output tok/s over size "
        "1's. Of roofline: rank 0's floor of the workload (bench/roofline.py on its shard) over the time.",
        "",
        table(
            offline,
            [
                ("model", "model", ""),
                ("tp", "TP", ""),
                ("out", "output tok/s", ",.0f"),
                ("total", "total tok/s", ",.0f"),
                ("s", "time s", ".2f"),
                ("ratio", "x TP 1", ".2f"),
                ("frac", "of roofline", ".0%"),
                ("steps", "steps", ""),
                ("pre", "preemptions", ""),
                ("pool", "KV pool tokens", ","),
            ],
        ),
        "",
        "## All-reduce",
        "",
        "bench/all_reduce_cost.py, in processes of its own before the engines: sum in place of bf16 messages, "
        "median µs of one call over runs of back-to-back calls (CUDA events), the slowest rank's. Eager: "
        "launched from Python; graph: replayed from a CUDA graph, as a decode step runs them. Bus bandwidth: "
        "2 (N - 1) / N x bytes / time of one large buffer.",
        "",
    ]
    if messages:
        parts += [table(messages, [("tp", "TP", ""), ("shape", "message", ""), ("bytes", "bytes", ","),
                                   ("eager", "µs eager", ".1f"), ("graph", "µs graph", ".1f")],
                        drop_absent=True), ""]  # fmt: skip
    if bus:
        columns = [("tp", "TP", ""), ("mib", "buffer MiB", ".0f"), ("us", "µs", ",.0f"),
                   ("alg", "algbw GB/s", ".1f"), ("bus", "busbw GB/s", ".1f"), ("note", "note", "")]  # fmt: skip
        parts += [table(bus, columns)]
    else:
        parts += ["No size above 1 ran."]
    return "\n".join(parts) + "\n"
