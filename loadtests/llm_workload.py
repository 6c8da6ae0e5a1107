"""What the load test sends: prompts (short and long), the cancelled share, and load shapes.

Options come from the Locust command line or the environment (see locustfile.py). Nothing here
imports Locust (whose import monkey-patches the process with gevent), so it is testable anywhere.
"""

from __future__ import annotations

import random

SHORT_PROMPTS = (
    "What is the capital of France?",
    "Give me three tips for writing clear code.",
    "Explain what a hash map is in one paragraph.",
    "Write a haiku about the sea.",
    "What is the difference between a process and a thread?",
    "Name five fruits that are red.",
    "How does a bicycle stay upright?",
    "Summarize the plot of Romeo and Juliet in two sentences.",
)

_LONG_TOPICS = ("a lighthouse keeper", "a small bakery", "a mountain railway", "a city library", "a research ship")
_LONG_SENTENCES = (
    "Every morning the work began before sunrise, with a list of tasks that never seemed to get shorter.",
    "Visitors rarely noticed the small repairs that kept everything running, but the staff did.",
    "There were records going back decades, written in a careful hand and stored in boxes by the window.",
    "When the weather turned, plans changed quickly and everyone helped wherever they were needed.",
    "The old equipment still worked, although nobody quite remembered who had installed it.",
    "In the evenings the place grew quiet, and the only sound was the wind against the walls.",
    "A new schedule was proposed every spring and quietly abandoned by the end of summer.",
    "Some days were uneventful; others brought a crowd of people with questions nobody could answer.",
)


def long_prompt(rng: random.Random, num_words: int) -> str:
    """A document of about num_words words followed by a question about it (deterministic per rng)."""
    topic = rng.choice(_LONG_TOPICS)
    words: list[str] = [f"This is a report about {topic}."]
    count = len(words[0].split())
    while count < num_words:
        sentence = rng.choice(_LONG_SENTENCES)
        words.append(sentence)
        count += len(sentence.split())
    return " ".join(words) + f"\n\nIn two sentences, what is this report about {topic} mostly about?"


def pick_prompt(rng: random.Random, mix: str, long_words: int, long_share: float = 0.3) -> tuple[str, str]:
    """(kind, prompt): kind is "short" or "long"; mix is "short", "long" or "mixed" (long_share long)."""
    if mix not in ("short", "long", "mixed"):
        raise ValueError(f"--prompt-mix must be short, long or mixed, got {mix!r}")
    is_long = mix == "long" or (mix == "mixed" and rng.random() < long_share)
    if is_long:
        return "long", long_prompt(rng, long_words)
    return "short", rng.choice(SHORT_PROMPTS)


def cancel_after(rng: random.Random, share: float, max_tokens: int) -> int | None:
    """Tokens after which this stream is dropped by the client (None: read to the end)."""
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"--cancel-share must be within [0, 1], got {share}")
    if rng.random() >= share:
        return None
    return rng.randint(1, max(1, min(8, max_tokens // 2)))


# ---- load shapes (INFERQ_LOAD_SHAPE=steady|ramp|burst; llm_shapes.py hands them to Locust) -------------

SHAPE_NAMES = ("steady", "ramp", "burst")
RAMP_STEPS = 10
BURST_PERIOD_S = 20.0
BURST_LENGTH_S = 5.0


def shape_tick(name: str, elapsed_s: float, users: int, seconds: float, spawn_rate: float) -> tuple[int, float] | None:
    """(users, spawn rate) a shape wants `elapsed_s` into the run; None ends the run.

    steady: `users` for `seconds` (sustained throughput).
    ramp:   1 to `users` in RAMP_STEPS equal steps over `seconds` (where latency starts to climb).
    burst:  a quarter of `users`, with all of them arriving at once for BURST_LENGTH_S of every
            BURST_PERIOD_S (admission control and queueing).
    """
    if name not in SHAPE_NAMES:
        raise ValueError(f"INFERQ_LOAD_SHAPE must be one of {SHAPE_NAMES}, got {name!r}")
    users, seconds, spawn_rate = max(1, users), max(1.0, seconds), max(0.1, spawn_rate)
    if elapsed_s >= seconds:
        return None
    if name == "steady":
        return users, spawn_rate
    if name == "ramp":
        step = int(elapsed_s / (seconds / RAMP_STEPS)) + 1
        return max(1, round(users * step / RAMP_STEPS)), spawn_rate
    in_burst = elapsed_s % BURST_PERIOD_S >= BURST_PERIOD_S - BURST_LENGTH_S
    return (users if in_burst else max(1, users // 4)), float(users)
