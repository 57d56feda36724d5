"""``servediag watch``: the diagnosis run again and again over a sliding window, what it found
served as Prometheus metrics (``state``: which findings are served, with hysteresis;
``exposition``: the metric text; ``loop``: the cycles, their errors and their clock)."""
