"""What one vLLM server's ``PrometheusStatLogger`` exposes, per version profile.

The simulator emits every family of :mod:`diagnoser.metrics.families` that the profile's vLLM
registers with no optional feature on, with the label values vLLM creates at start-up, and
nothing else; ``tests/test_conformance.py`` holds each profile to the family list read from
that version's wheel (``tests/data/vllm-VERSION.json``). Observations follow
``vllm/v1/metrics/stats.py`` and ``loggers.py`` of the profile's version:

- per output message (``PrometheusStatLogger.record`` with ``IterationStats``): TTFT at a
  request's first token, ITL per later output, ``iteration_tokens`` (generated tokens plus the
  prompts of the requests whose first token it carries: uncached tokens from 0.23, the whole
  prompt before), prompt and generation token counters, preemptions;
- per finished request (``FinishedRequestStats``): e2e, queue, prefill, decode and inference
  times, prompt and generation lengths, ``max_tokens``, ``n``, preemptions (0 included), the
  uncached prompt tokens, and the per-request TPOT (0 for one token or none).
"""

from __future__ import annotations

import functools

import numpy as np

from diagnoser.metrics import families as F
from diagnoser.metrics.buckets import CUSTOM_FAMILIES, version_key
from diagnoser.metrics.exposition import Histogram, Labels, Recorder
from diagnoser.metrics.families import Family
from diagnoser.sim.engine import Engine, EngineConfig, Request
from diagnoser.sim.engine_stats import EngineStats
from diagnoser.sim.kv_transfer import NixlMetrics, in_transfer

# A profile and the vLLM release its families are held to.
PROFILES = {"0.33": "0.33.0", "0.10": "0.10.2", "0.8": "0.8.5"}


def release(profile: str) -> str:
    return PROFILES[profile]


@functools.cache
def _at_least(profile: str, version: str) -> bool:
    return version_key(release(profile)) >= version_key(version)


def _exposed(profile: str) -> list[Family]:
    """``vllm_families`` of the profile's release, listed once per state of the registry
    (asked at every scrape of every engine)."""
    return _listed(release(profile), len(F.FAMILIES))


@functools.cache
def _listed(release: str, registered: int) -> list[Family]:
    return F.vllm_families(release)


class EngineMetrics:
    """One engine's histograms and counters, reset when the server restarts."""

    HISTOGRAMS = (
        F.TTFT,
        F.ITL,
        F.TPOT_OLD,
        F.TPOT,
        F.E2E,
        F.QUEUE,
        F.INFERENCE,
        F.PREFILL,
        F.DECODE,
        F.PROMPT,
        F.GENERATION,
        F.MAX_TOKENS,
        F.MAX_GENERATION,
        F.PARAMS_N,
        F.STEP_TOKENS,
        F.PREEMPTIONS_PER_REQUEST,
        F.PREFILL_COMPUTED,
    )

    def __init__(
        self,
        max_model_len: int,
        profile: str,
        custom: dict[str, tuple[float, ...]] | None = None,
    ):
        """``custom``: bounds by --custom-histogram-buckets' family key, for the families
        the site sets (every histogram of the family takes them)."""
        self.profile = profile
        bounds = {
            metric: tuple(b)
            for family, b in (custom or {}).items()
            for metric in CUSTOM_FAMILIES[family]
        }
        self.h = {
            f.name: Histogram(bounds.get(f.name) or f.bucket_bounds(max_model_len))
            for f in self.HISTOGRAMS
        }
        self.finished = dict.fromkeys(F.FINISHED_REASONS, 0.0)
        self.counters = dict.fromkeys(
            (
                F.PROMPT_TOKENS,
                F.GENERATION_TOKENS,
                F.PREEMPTIONS,
                F.PREFIX_QUERIES,
                F.PREFIX_HITS,
                F.PROMPT_TOKENS_CACHED,
            ),
            0.0,
        )
        self.by_source = dict.fromkeys(F.PROMPT_TOKENS_BY_SOURCE.values, 0.0)
        # --speculative-config: vllm/v1/spec_decode/metrics.py's counters (none without it).
        self.spec = dict.fromkeys((F.SPEC_DRAFTS, F.SPEC_DRAFT_TOKENS, F.SPEC_ACCEPTED), 0.0)
        self.accepted_per_pos = np.zeros(0)
        self.nixl = NixlMetrics()  # exported only by a KV connector's instances

    def absorb(
        self, st: EngineStats, block_size: int, kv_bytes_per_token: float = 0.0
    ) -> list[Request]:
        """Fold an engine's observations in; returns the finished requests."""
        h = {f: self.h[f.name] for f in self.HISTOGRAMS}
        h[F.TTFT].observe(st.ttft)
        if st.itl:
            v, w = zip(*st.itl, strict=True)
            gaps, counts = np.array(v), np.array(w, dtype=np.float64)
            h[F.ITL].observe(gaps, counts)
            h[F.TPOT_OLD].observe(gaps, counts)  # before 0.15: the same gaps, a second name
        # 0.23 changed iteration_tokens to count only the prompt tokens computed.
        batches = st.batches if _at_least(self.profile, "0.23") else st.batches_full_prompt
        if batches:  # one observation of them all: whole numbers, so the sums are exact
            h[F.STEP_TOKENS].observe(
                np.concatenate([b[0] for b in batches]), np.concatenate([b[1] for b in batches])
            )
        fin = st.finished
        if fin:
            self._finished(h, fin)
        c = self.counters
        c[F.PROMPT_TOKENS] += st.prompt_tokens
        c[F.GENERATION_TOKENS] += st.generation_tokens
        c[F.PREEMPTIONS] += st.preemptions
        c[F.PROMPT_TOKENS_CACHED] += st.cached_tokens
        # Before 0.9 the prefix cache counted blocks, not tokens.
        unit = 1 if _at_least(self.profile, "0.9") else block_size
        c[F.PREFIX_QUERIES] += st.prefix_queries // unit
        c[F.PREFIX_HITS] += st.prefix_hits // unit
        if st.drafts:
            self.spec[F.SPEC_DRAFTS] += st.drafts
            self.spec[F.SPEC_DRAFT_TOKENS] += st.draft_tokens
            self.spec[F.SPEC_ACCEPTED] += st.accepted
            if self.accepted_per_pos.size != st.accepted_per_pos.size:
                self.accepted_per_pos = np.zeros(st.accepted_per_pos.size)
            self.accepted_per_pos += st.accepted_per_pos
        self.by_source["local_compute"] += st.prompt_tokens - st.cached_tokens
        self.by_source["local_cache_hit"] += st.cached_tokens - st.external_tokens
        self.by_source["external_kv_transfer"] += st.external_tokens
        self.nixl.absorb(st, block_size * kv_bytes_per_token)
        if st.errors:  # ended by a failed KV load: no token, finished_reason "error"
            self.finished["error"] += len(st.errors)
            h[F.E2E].observe([r.last_token - r.arrival for r in st.errors])
        return [*fin, *st.errors]

    def _finished(self, h: dict[Family, Histogram], fin: list[Request]) -> None:
        """``PrometheusStatLogger.record``'s loop over ``finished_requests``."""
        arrival = np.array([r.arrival for r in fin])
        sched = np.array([r.scheduled for r in fin])
        ready = np.array([r.ready for r in fin])
        first = np.array([r.first_token for r in fin])
        last = np.array([r.last_token for r in fin])
        gen = np.array([r.generated for r in fin], dtype=np.float64)
        prompt = np.array([r.prompt for r in fin], dtype=np.float64)
        h[F.E2E].observe(last - arrival)
        h[F.QUEUE].observe(sched - ready)  # first QUEUED to first SCHEDULED
        h[F.INFERENCE].observe(last - sched)
        h[F.PREFILL].observe(first - sched)
        h[F.DECODE].observe(last - first)
        # FinishedRequestStats.mean_time_per_output_token: 0 when one token or none.
        tpot = np.where(gen > 1, (last - first) / np.maximum(gen - 1, 1), 0.0)
        h[F.TPOT].observe(tpot)
        h[F.PROMPT].observe(prompt)
        h[F.GENERATION].observe(gen)
        h[F.MAX_TOKENS].observe([r.max_tokens for r in fin])
        # n = 1: each request is its own parent, so these come at its finish.
        h[F.PARAMS_N].observe(np.ones(len(fin)))
        h[F.MAX_GENERATION].observe(gen)
        h[F.PREEMPTIONS_PER_REQUEST].observe([r.preemptions for r in fin])
        h[F.PREFILL_COMPUTED].observe(prompt - np.array([r.first_cached for r in fin]))
        for r in fin:
            self.finished["length" if r.length_stop else "stop"] += 1


def cache_config(cfg: EngineConfig, blocks: int, engines: int, profile: str) -> dict[str, str]:
    """``CacheConfig.metrics_info()``: every field of the profile's CacheConfig, as strings.

    The API server sums ``num_gpu_blocks`` over its data-parallel engines
    (``core_client``'s start-up handshake); from 0.24 ``kv_cache_size_tokens`` and
    ``kv_cache_max_concurrency`` are each engine's own (``update_kv_cache_capacity``).
    """
    common = {
        "block_size": str(cfg.block_size),
        "gpu_memory_utilization": str(cfg.gpu_memory_utilization),
        "cache_dtype": "auto" if cfg.kv_cache_dtype_bytes == 2 else "fp8",
        "is_attention_free": "False",
        "num_gpu_blocks_override": "None",
        "sliding_window": "None",
        "enable_prefix_caching": str(cfg.enable_prefix_caching),
        "prefix_caching_hash_algo": "sha256",
        "num_gpu_blocks": str(blocks * engines),
        "num_cpu_blocks": "0",
    }
    if profile == "0.8":
        old = {"swap_space": "4", "cpu_offload_gb": "0", "calculate_kv_scales": "False"}
        return {
            **common,
            **old,
            "prefix_caching_hash_algo": "builtin",
            "swap_space_bytes": "4294967296",
        }
    if profile == "0.10":
        return {
            **common,
            "swap_space": "4",
            "cpu_offload_gb": "0",
            "calculate_kv_scales": "False",
            "cpu_kvcache_space_bytes": "None",
            "mamba_page_size_padded": "None",
            "mamba_cache_dtype": "auto",
            "mamba_ssm_cache_dtype": "auto",
            "kv_sharing_fast_prefill": "False",
            "kv_cache_memory_bytes": "None",
            "swap_space_bytes": "4294967296",
        }
    per_request = -(-cfg.max_model_len // cfg.block_size)
    concurrency = blocks / per_request
    return {
        **common,
        "user_specified_block_size": "False",
        "kv_cache_layout": "None",
        "prefix_match_unit": "None",
        "prefix_cache_retention_interval": "0",
        "kv_cache_dtype_skip_layers": "[]",
        "mamba_page_size_padded": "None",
        "skip_page_size_padded": "None",
        "mamba_block_size": "None",
        "mamba_cache_dtype": "auto",
        "mamba_ssm_cache_dtype": "auto",
        "mamba_cache_mode": "none",
        "enable_mamba_shared_prefix_checkpoint": "False",
        "replayssm_buffer_len": "16",
        "use_replayssm": "False",
        "use_kda_recoverssm": "False",
        "simple_cpu_offload_num_blocks": "None",
        "effective_attention_block_size": str(cfg.block_size),
        "kv_cache_size_tokens": str(int(concurrency * cfg.max_model_len)),
        "kv_cache_max_concurrency": str(concurrency),
        "hash_block_size": str(cfg.block_size),
        "cache_hit_alignment_tokens": "None",
        "kv_sharing_fast_prefill": "False",
        "swa_bounded_replay": "True",
        "kv_cache_memory_bytes": "None",
        "kv_offloading_size": "None",
        "kv_offloading_backend": "native",
        "_block_size_resolved": "True",
    }


def record_engine(
    rec: Recorder,
    t: float,
    base: Labels,
    index: int,
    engine: Engine,
    em: EngineMetrics,
    engines: int,
) -> None:
    """One engine's series at a scrape: every family the profile exposes, at its values."""
    profile = em.profile
    lb = _labels(base, engine=str(index))
    # Requests still being tokenized are the API server's, not the engine's queue; those
    # whose KV is being loaded from another instance are the engine's, held back (deferred).
    loading = in_transfer(engine, t) if engine.cfg.kv_consumer else 0
    waiting = float(sum(1 for r in engine.waiting if r.ready <= t) + loading)
    # Skipped by the scheduler (a LoRA slot) and not scheduled since: vLLM's deferred_waiting.
    deferred = float(sum(1 for r in engine.waiting if r.deferred) + loading)
    gauges = {
        F.RUNNING: float(engine.num_running()),
        F.WAITING: waiting,
        F.KV_USAGE: engine.kv_usage(),
        F.KV_USAGE_OLD: engine.kv_usage(),
    }
    counters = {
        **em.counters,
        F.PREFIX_QUERIES_OLD: em.counters[F.PREFIX_QUERIES],
        F.PREFIX_HITS_OLD: em.counters[F.PREFIX_HITS],
    }
    by_label: dict[Family, dict[str, float]] = {
        F.WAITING_BY_REASON: {"capacity": waiting - deferred, "deferred": deferred},
        F.SLEEP_STATE: {"awake": 1.0, "weights_offloaded": 0.0, "discard_all": 0.0},
        F.PROMPT_TOKENS_BY_SOURCE: em.by_source,
        # Counted at admission, so the local tier's share is the prefix-cache hits.
        F.PROMPT_TOKENS_CACHED_BY_SOURCE: {"device": em.counters[F.PREFIX_HITS]},
        F.SUCCESS: em.finished,
    }
    reasons = F.FINISHED_REASONS if _at_least(profile, "0.14") else F.FINISHED_REASONS_OLD
    for fam in _exposed(profile):
        if fam is F.CACHE_CONFIG:
            info = cache_config(engine.cfg, engine.num_blocks, engines, profile)
            target = {k: v for k, v in base if k != "model_name"}  # vLLM gives it no model
            labels = tuple(sorted({**target, **info, "engine": str(index)}.items()))
            rec.sample(fam.name, fam.type, fam.help, labels, t, 1.0)
        elif fam is F.ADMISSION_REJECTIONS:
            continue  # the API server's, no engine label: see record_api_server
        elif fam.type == "histogram":
            rec.sample_histogram(fam.name, fam.help, lb, t, em.h[fam.name])
        elif fam in gauges:
            rec.sample(fam.name, fam.type, fam.help, lb, t, gauges[fam])
        elif fam in by_label:
            values = by_label[fam]
            for value in reasons if fam is F.SUCCESS else fam.values:
                labels = _labels(lb, **{fam.labels[0]: value})
                rec.sample(fam.name, fam.type, fam.help, labels, t, values.get(value, 0.0))
        else:  # counters; the ones the simulator does not drive stay at 0
            rec.sample(fam.name, fam.type, fam.help, lb, t, counters.get(fam, 0.0))
    if (engine.cfg.kv_consumer or engine.cfg.kv_producer) and _at_least(profile, "0.12"):
        # NixlConnector's families, on either side; the fetch-stage gauge on a consumer only
        stages = engine.cfg.kv_consumer and _at_least(profile, "0.33")
        em.nixl.record(rec, t, lb, float(loading) if stages else None)
    k = engine.cfg.num_speculative_tokens
    if k:  # SpecDecodingProm: created at start-up with the config, positions 0..k-1
        for spec_fam, count in em.spec.items():
            rec.sample(spec_fam.name, spec_fam.type, spec_fam.help, lb, t, count)
        fam = F.SPEC_ACCEPTED_PER_POS
        per_pos = em.accepted_per_pos if em.accepted_per_pos.size == k else np.zeros(k)
        for pos in range(k):
            labels = _labels(lb, position=str(pos))
            rec.sample(fam.name, fam.type, fam.help, labels, t, float(per_pos[pos]))


def record_api_server(rec: Recorder, t: float, base: Labels, profile: str) -> None:
    """The API server's own vLLM families (no ``engine`` label)."""
    fam = F.ADMISSION_REJECTIONS
    if fam.exposed_in(release(profile)):
        for reason in fam.values:
            rec.sample(fam.name, fam.type, fam.help, _labels(base, reason=reason), t, 0.0)


def _labels(base: Labels, **extra: str) -> Labels:
    return tuple(sorted({**dict(base), **extra}.items()))
