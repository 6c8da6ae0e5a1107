"""Scheduler: token budget, chunked prefill, admission while blocks last, preemption order, priority."""

from engine.block_manager import BlockManager
from engine.config import SchedulerConfig
from engine.request import FinishReason, Request, RequestStatus
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler

BS = 4


def make(rid: str, n: int, priority: int = 0, arrival: float = 0.0) -> Request:
    return Request(
        request_id=rid,
        prompt_token_ids=[(hash(rid) + i) % 1000 for i in range(n)],
        sampling_params=SamplingParams(),
        priority=priority,
        arrival_time=arrival,
    )


def sched(num_blocks: int, budget: int = 64, max_seqs: int = 8, policy: str = "fcfs") -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, policy=policy),
        BlockManager(num_blocks, BS),
    )


def run_step(s: Scheduler, new_token: int = 7):
    """Apply a schedule the way the engine does: computed tokens advance, samplers get a token."""
    out = s.schedule()
    for item in out.scheduled:
        item.request.num_computed_tokens += item.num_new_tokens
        s.block_manager.cache_full_blocks(item.request, item.request.num_computed_tokens)
        if item.samples:
            item.request.append_token(new_token)
    return out


def test_prefill_and_decode_share_one_step():
    s = sched(32)
    a = make("a", 6)
    s.add_request(a)
    out = run_step(s)
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 6)]
    b = make("b", 5)
    s.add_request(b)
    out = run_step(s)
    # a decodes one token and b prefills in the same step.
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1), ("b", 5)]
    assert out.new_request_ids == ["b"]


def test_chunked_prefill_respects_the_budget_and_samples_only_at_the_end():
    s = sched(32, budget=8)
    a = make("a", 20)
    s.add_request(a)
    chunks = []
    for _ in range(3):
        out = run_step(s)
        chunks.append((out.scheduled[0].num_new_tokens, out.scheduled[0].samples))
    assert chunks == [(8, False), (8, False), (4, True)]
    assert a.output_token_ids == [7]


def test_budget_is_shared_first_come_first_served():
    s = sched(32, budget=10)
    a, b, c = make("a", 6), make("b", 6), make("c", 6)
    for r in (a, b, c):
        s.add_request(r)
    out = run_step(s)
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 6), ("b", 4)]
    assert list(s.waiting) == [c]


def test_admission_stops_when_blocks_run_out():
    s = sched(4)  # 16 token slots
    a, b = make("a", 12), make("b", 8)  # a: 3 blocks, b: 2 blocks
    s.add_request(a)
    s.add_request(b)
    out = run_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["a"]
    assert s.block_manager.get_block_ids("a") == [0, 1, 2]
    assert b.status is RequestStatus.WAITING and b.num_computed_tokens == 0


def test_max_num_seqs_caps_running():
    s = sched(64, max_seqs=2)
    for rid in "abc":
        s.add_request(make(rid, 3))
    run_step(s)
    assert [r.request_id for r in s.running] == ["a", "b"]


def test_preemption_takes_the_tail_and_requeues_it_first():
    s = sched(4, budget=64)
    a, b = make("a", 8), make("b", 8)  # 2 blocks each: the pool is full after admission
    s.add_request(a)
    s.add_request(b)
    run_step(s)
    assert s.block_manager.get_block_ids("a") == [0, 1]
    assert s.block_manager.get_block_ids("b") == [2, 3]
    # Both now need a 3rd block for their 9th token: b (the tail) is preempted for a.
    out = run_step(s)
    assert out.preempted_request_ids == ["b"]
    assert [(x.request.request_id, x.num_new_tokens) for x in out.scheduled] == [("a", 1)]
    assert s.block_manager.get_block_ids("a") == [0, 1, 3]  # b's tail block freed first, reused first
    assert b.status is RequestStatus.PREEMPTED and b.num_computed_tokens == 0 and b.num_preemptions == 1
    assert list(s.waiting) == [b]
    assert s.num_preemptions == 1


def test_preempted_request_resumes_with_prefix_cache_hits_after_room_frees():
    s = sched(5, budget=64)
    a, b = make("a", 8), make("b", 8)
    s.add_request(a)
    s.add_request(b)
    run_step(s)  # a: [0, 1], b: [2, 3]
    run_step(s)  # a, b each take a 3rd block: a [0,1,4]; b needs one more -> preempt b
    assert s.running == [a]
    s.finish_request(a, FinishReason.STOP)
    out = run_step(s)
    # b comes back: its two full prompt blocks were kept in the cache; it recomputes only the rest.
    item = out.scheduled[0]
    assert item.request is b and item.num_computed_tokens == 8 and item.num_new_tokens == 1


def test_priority_policy_orders_waiting_and_preempts_lowest_priority():
    s = sched(4, policy="priority")
    low = make("low", 8, priority=5, arrival=0.0)
    high = make("high", 8, priority=0, arrival=1.0)
    s.add_request(low)
    s.add_request(high)
    assert [r.request_id for r in s.waiting] == ["high", "low"]
    run_step(s)
    assert [r.request_id for r in s.running] == ["high", "low"]
    out = run_step(s)
    assert out.preempted_request_ids == ["low"]


def test_finish_frees_blocks_and_removes_from_running():
    s = sched(8)
    a = make("a", 6)
    s.add_request(a)
    run_step(s)
    s.finish_request(a, FinishReason.ABORT)
    assert s.running == [] and s.block_manager.num_free_blocks == 8
    assert a.finish_reason is FinishReason.ABORT


def test_waiting_request_can_be_finished():
    s = sched(8)
    a = make("a", 6)
    s.add_request(a)
    s.finish_request(a, FinishReason.ABORT)
    assert not s.has_unfinished()


def test_n_siblings_wait_for_the_first_prompt_then_share_its_blocks():
    s = sched(16)
    prompt = list(range(9))
    kids = [Request(f"p#{i}", list(prompt), SamplingParams(n=2), parent_id="p", choice_index=i) for i in range(2)]
    for k in kids:
        s.add_request(k)
    out = run_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["p#0"]
    out = run_step(s)
    second = [x for x in out.scheduled if x.request.request_id == "p#1"][0]
    assert second.num_computed_tokens == 8  # two full blocks shared
    assert s.block_manager.get_block_ids("p#1")[:2] == s.block_manager.get_block_ids("p#0")[:2]


def test_proposed_tokens_take_budget_and_blocks_but_never_preempt():
    s = sched(4)  # 16 slots: a (6 tokens) and b (5) hold two blocks each after their prefill
    a, b = make("a", 6), make("b", 5)
    s.add_request(a)
    s.add_request(b)
    run_step(s)
    a.proposed_token_ids = [11]  # 6 computed + its newest token + 1: fits a's two blocks
    out = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens, x.proposed_token_ids) for x in out.scheduled] == [
        ("a", 2, [11]),
        ("b", 1, []),
    ]
    for item in out.scheduled:
        item.request.num_computed_tokens += item.num_new_tokens
    a.num_computed_tokens, b.num_computed_tokens = 6, 5  # the engine keeps a's verified tokens only
    a.proposed_token_ids = [13, 14, 15]  # 6 computed + 1 + 3: a third block, and none is free
    out = s.schedule()
    assert [(x.request.request_id, x.num_new_tokens, x.proposed_token_ids) for x in out.scheduled] == [
        ("a", 1, []),
        ("b", 1, []),
    ]
    assert not out.preempted_request_ids and s.num_preemptions == 0


def test_a_waiting_request_of_higher_priority_takes_a_full_batchs_newest_lowest_slot():
    """max_num_seqs reached by batch lines (priority 1000): an interactive request (0) preempts the newest of
    them at once instead of waiting for one to finish (decision 0062); the line waits behind it, keeps its
    place among equals, and comes back, recomputing from its tokens, when a slot frees."""
    s = sched(64, max_seqs=2, policy="priority")
    first, second = make("line0", 4, priority=1000, arrival=0.0), make("line1", 4, priority=1000, arrival=1.0)
    queued = make("line2", 4, priority=1000, arrival=2.0)
    for request in (first, second, queued):
        s.add_request(request)
    run_step(s)
    run_step(s)
    assert s.running == [first, second]
    interactive = make("chat", 4, priority=0, arrival=3.0)
    s.add_request(interactive)
    out = run_step(s)
    assert out.preempted_request_ids == ["line1"]
    assert [x.request.request_id for x in out.scheduled] == ["line0", "chat"]
    assert s.running == [first, interactive]
    assert [r.request_id for r in s.waiting] == ["line1", "line2"]  # arrival order among the lines
    assert second.status is RequestStatus.PREEMPTED and second.num_computed_tokens == 0
    assert out.new_request_ids == ["chat"]
    s.finish_request(first, FinishReason.STOP)
    out = run_step(s)
    assert [x.request.request_id for x in out.scheduled] == ["chat", "line1"]
    # its prompt block was kept in the prefix cache: it recomputes only its two sampled tokens
    assert (out.scheduled[1].num_computed_tokens, out.scheduled[1].num_new_tokens) == (4, 2)


def test_equal_priorities_and_fcfs_never_preempt_for_a_slot():
    for policy, priority in (("priority", 1000), ("fcfs", 0)):
        s = sched(64, max_seqs=2, policy=policy)
        running = [make("a", 4, priority=1000, arrival=0.0), make("b", 4, priority=1000, arrival=1.0)]
        for request in running:
            s.add_request(request)
        run_step(s)
        s.add_request(make("c", 4, priority=priority, arrival=2.0))
        out = run_step(s)
        assert not out.preempted_request_ids and s.running == running, policy


def test_a_higher_priority_takes_the_blocks_of_a_lower_one_when_the_pool_is_full():
    s = sched(4, policy="priority")
    low = make("low", 15, priority=1000)  # all 4 blocks, room in the last for its next token
    s.add_request(low)
    run_step(s)
    assert s.block_manager.num_free_blocks == 0
    high = make("high", 4, priority=0, arrival=1.0)
    s.add_request(high)
    out = run_step(s)
    assert out.preempted_request_ids == ["low"]
    assert [x.request.request_id for x in out.scheduled] == ["high"]
    assert list(s.waiting) == [low]


def test_beside_an_interactive_request_background_work_starts_only_up_to_its_cap():
    """max_background_seqs 2 of 8 slots (decision 0066): a batch alone fills every slot; once an interactive
    request (priority 0) runs, lines that end are not replaced until at most 2 run; when it ends they fill
    the slots again. Running lines are never preempted for the cap."""
    s = Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, policy="priority", max_background_seqs=2),
        BlockManager(256, BS),
    )
    lines = [make(f"line{i}", 4, priority=1000, arrival=float(i)) for i in range(12)]
    for line in lines[:4]:
        s.add_request(line)
    run_step(s)
    assert len(s.running) == 4  # alone, past the cap
    chat = make("chat", 4, priority=0, arrival=20.0)
    s.add_request(chat)
    for line in lines[4:]:
        s.add_request(line)
    out = run_step(s)
    assert not out.preempted_request_ids  # a free slot: nothing to preempt, and the cap preempts nothing
    assert out.new_request_ids == ["chat"]  # the waiting lines stay waiting: 4 already run beside it
    assert [r.request_id for r in s.running] == ["line0", "line1", "line2", "line3", "chat"]
    for line in lines[:3]:  # three lines end: 1 left, under the cap, so one more starts
        s.finish_request(line, FinishReason.STOP)
    out = run_step(s)
    assert out.new_request_ids == ["line4"]
    assert sum(r.priority > 0 for r in s.running) == 2
    out = run_step(s)
    assert out.new_request_ids == []
    s.finish_request(chat, FinishReason.STOP)  # alone again: the lines take every slot
    out = run_step(s)
    assert out.new_request_ids == [f"line{i}" for i in range(5, 11)]
    assert len(s.running) == 8


def test_without_a_cap_or_under_fcfs_background_work_fills_the_slots_beside_interactive_requests():
    for policy, cap in (("priority", None), ("fcfs", 2)):
        s = Scheduler(
            SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=256, policy=policy, max_background_seqs=cap),
            BlockManager(256, BS),
        )
        s.add_request(make("chat", 4, priority=0, arrival=0.0))
        run_step(s)
        for i in range(7):
            s.add_request(make(f"line{i}", 4, priority=1000, arrival=1.0 + i))
        out = run_step(s)
        assert len(out.new_request_ids) == 7 and len(s.running) == 8, policy


def test_the_running_background_count_follows_admissions_preemptions_and_finishes():
    """The background cap reads a count kept where `running` changes (not a walk of it): after every step of a
    mix of lines and interactive requests, through preemptions for priority and for blocks and finishes of
    running and waiting requests, it equals a count of `running`."""
    s = Scheduler(
        SchedulerConfig(max_num_seqs=6, max_num_batched_tokens=64, policy="priority", max_background_seqs=3),
        BlockManager(24, BS),
    )
    requests = [make(f"r{i}", 6 + i % 5, priority=1000 if i % 3 else 0, arrival=float(i)) for i in range(30)]
    preempted = 0
    for step, request in enumerate(requests):
        s.add_request(request)
        out = run_step(s)
        preempted += len(out.preempted_request_ids)
        if step % 4 == 3 and s.running:
            s.finish_request(s.running[0], FinishReason.STOP)
        if step % 7 == 6 and s.waiting:
            s.finish_request(s.waiting[-1], FinishReason.ABORT)
        assert s.num_background_running == sum(r.priority > 0 for r in s.running), step
    assert preempted > 0  # the run went through preemptions, not only admissions and finishes
