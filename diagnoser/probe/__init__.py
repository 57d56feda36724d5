"""``servediag probe``: a synthetic streaming client for OpenAI-compatible servers.

It sends small streamed requests in fixed prompt length classes on a schedule, measures what a
user sees (time to first token, gaps between tokens, the whole request, the outcome) and
exports the ``llm_probe_*`` families on its own ``/metrics``.
"""
