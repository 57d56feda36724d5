"""A real vLLM in the loop: vLLM's CPU build serving a tiny Llama-shaped model with random
weights, scraped by a real Prometheus, driven through incidents and diagnosed.

``venv`` installs vLLM's CPU build into a virtualenv of its own; ``model`` makes the model's
``config.json`` and a word-level tokenizer (no download); ``server`` starts, stops, kills and
freezes the server; ``load`` is the bounded open-loop load generator; ``incident`` reads the
incident files (``fixtures/real/*.yaml``); ``run`` runs one incident end to end and records it
(``tests/data/real/``); ``__main__`` is ``make real`` and ``make bench-real``.
"""
