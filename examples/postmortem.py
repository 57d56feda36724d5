# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # The postmortem, the morning after
#
# Last night `diagnose --since 1h` named the cause. This notebook takes the same diagnosis
# into pandas to write it up: what was found and on what evidence, the evidence plotted,
# and the incident hour set against the hour before it.
#
# Open it with `jupytext --to notebook examples/postmortem.py` (or run it as a script).
# It needs `pip install 'servediag[notebook]'` (pandas and prometheus-api-client); plots
# appear when matplotlib is installed. Set the three values below to your incident.

# %%
import os

PROMETHEUS_URL = os.environ.get("PROMETHEUS_URL", "http://localhost:9090")
# The end of the hour that went wrong (RFC 3339 or Unix seconds); empty for now.
UNTIL = os.environ.get("POSTMORTEM_UNTIL") or None
SINCE = os.environ.get("POSTMORTEM_SINCE", "1h")

# %% [markdown]
# ## The diagnosis
#
# `diagnose` takes a URL, or a `PrometheusConnect` you already configured (headers, auth,
# TLS, session: all are used). The likely cause comes first.

# %%
import diagnoser

try:
    from prometheus_api_client import PrometheusConnect

    source = PrometheusConnect(url=PROMETHEUS_URL)
except ImportError:  # the URL does as well
    source = PROMETHEUS_URL

d = diagnoser.diagnose(source, since=SINCE, until=UNTIL)
for health in d.health:
    print(health.scope, health.verdict, "; ".join(health.reasons))
for m in d.findings:
    print(f"{m.confidence:.0%}  {m.playbook.id}: {m.playbook.title}  {m.scope}")

# %% [markdown]
# ## What each finding rests on
#
# One row per finding and condition, with the numbers the text report prints.

# %%
findings = d.findings_frame()
findings[["rank", "id", "signal", "condition", "holds", "baseline", "now", "ratio", "evidence"]]

# %% [markdown]
# ## The evidence of the first finding, over time
#
# `to_frame()` is every series the diagnosis read, long format; `evidence_for` names the
# findings each signal is evidence for on its scope.

# %%
series = d.to_frame()
first = d.findings[0].playbook.id if d.findings else None
evidence = series[series["evidence_for"].str.split(",").apply(lambda ids: first in ids)]
wide = evidence.pivot_table(index="time", columns="signal", values="value")
print(f"{first}: {', '.join(wide.columns)} over {len(wide)} steps")
try:
    import matplotlib

    matplotlib.use(os.environ.get("MPLBACKEND", "Agg"))
    axes = wide.plot(subplots=True, figsize=(10, 2 * len(wide.columns)), title=first)
except ImportError:
    print(wide.resample("5min").mean().round(3).to_string())

# %% [markdown]
# ## The incident hour against the hour before
#
# The median of each signal in the window and in its baseline, and how far it moved:
# the table a postmortem's "what changed" section starts from.

# %%
import numpy as np

by_period = (
    series[series["period"].isin(["baseline", "window"])]
    .groupby(["signal", "unit", "period"])["value"]
    .median()
    .unstack("period")
)
by_period["change"] = by_period["window"] / by_period["baseline"].where(by_period["baseline"] != 0)
# Farthest from 1 first, a fall as far as a rise (x0.25 as far as x4).
far = by_period["change"].abs().pipe(np.log).abs()
moved = by_period.assign(far=far).dropna(subset=["change"]).sort_values("far", ascending=False)
moved.drop(columns="far").head(12).round(3)
