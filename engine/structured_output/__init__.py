"""Structured output: constraints (JSON schema, any JSON object, regex, choice, EBNF grammar) compiled by
xgrammar into token masks that the sampler applies to a request's logits (docs/decisions/0058-structured-output-
engine.md).

- constraint.py: the request's `structured_output` value, checked, and its cache key;
- compiler.py: compiles constraints off the engine loop, cached, under a time limit;
- grammar_state.py: one choice's matcher: the tokens it accepted, the next step's mask;
- masking.py: the sampler's step: fill the constrained rows' masks on the host, apply them on the device;
- admission.py: the engine's requests that wait for their grammar.
"""
