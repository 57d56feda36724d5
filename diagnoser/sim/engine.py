"""One vLLM engine, simulated from its mechanics.

The engine runs in phases on its own clock. A *prefill phase* pushes the pending prompt
tokens through chunked-prefill steps under the per-step token budget
(``max_num_batched_tokens``), each step also carrying one decode token for every running
sequence; a *decode phase* runs decode-only steps until something changes (a request becomes
ready, a sequence finishes, the phase quantum ends). Step times come from the hardware:

- prefill is compute-bound: 2 x params FLOPs per token, plus attention that grows with the
  square of the prompt (so long prompts cost more than their length);
- decode is memory-bandwidth-bound: every step reads the weights and the KV cache of every
  running sequence, so inter-token latency grows with batch size and context;
- a step carrying both pays for the chunk's compute and the decodes' KV reads.

The cost model and its calibration against measured GPU step times are in ``costs``; the
engine's flags in ``engine_config``.

The KV cache is counted in blocks; capacity follows from GPU memory, weights and overhead.
When a running sequence needs a block and none is free, the newest sequence is preempted and
later recomputed, as vLLM V1 does. Everything observable is recorded in ``EngineStats`` at the
moment vLLM's own metric code observes it (``vllm/v1/metrics/stats.py`` and ``loggers.py`` of
0.33; each place names the function it follows).
"""

from __future__ import annotations

import itertools
import math
from collections import deque

import numpy as np

from diagnoser.hardware.presets import GpuSpec, ModelSpec
from diagnoser.sim import costs
from diagnoser.sim.batch import CHAT as CHAT  # re-exported
from diagnoser.sim.batch import Batch
from diagnoser.sim.batch import Request as Request  # re-exported
from diagnoser.sim.engine_config import EngineConfig as EngineConfig  # re-exported
from diagnoser.sim.engine_stats import EngineStats
from diagnoser.sim.speculation import speculate


class Engine:
    """A single vLLM engine (one data-parallel rank)."""

    def __init__(
        self, spec: ModelSpec, g: GpuSpec, cfg: EngineConfig, start: float = 0.0, seed: int = 0
    ):
        self.spec, self.gpu, self.cfg = spec, g, cfg
        self.rng = np.random.default_rng(seed)  # draws only for speculative decoding
        self.num_blocks = cfg.num_gpu_blocks(spec, g)
        overhead, per_sequence = cfg.step_costs(g)
        self.costs = costs.StepCosts.build(
            spec,
            g,
            mfu=cfg.mfu,
            mbu=cfg.mbu,
            overhead=overhead,
            per_sequence=per_sequence,
            overlap=not g.host_bound,
            kv_dtype_bytes=cfg.kv_cache_dtype_bytes,
            tensor_parallel=cfg.tensor_parallel,
        )
        self.clock = start
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.running = Batch()
        self.stats = EngineStats()
        # A prefill run alone since the running streams' last token: its seconds, and how
        # many of the streams (the first in the batch) waited for it.
        self.stall, self.stalled = 0.0, 0

    def prefill_budget(self) -> int:
        """Prompt tokens a step may prefill: the step's token budget, less a token for each
        sequence decoded in the same step (none when prefill runs alone)."""
        n_dec = len(self.running) if self.cfg.mixed_chunk else 0
        return self.cfg.max_num_batched_tokens - n_dec

    # --- capacity -----------------------------------------------------------------------

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.cfg.block_size)

    def _prefill_blocks(self) -> int:
        return sum(self.blocks_for(r.prompt + r.generated) for r in self.prefilling)

    def used_blocks(self) -> int:
        return self.running.blocks(self.cfg.block_size) + self._prefill_blocks()

    def kv_usage(self) -> float:
        return min(1.0, self.used_blocks() / self.num_blocks) if self.num_blocks else 1.0

    def fits_max_model_len(self) -> bool:  # vLLM refuses to start otherwise
        return self.num_blocks * self.cfg.block_size >= self.cfg.max_model_len

    def num_running(self) -> int:
        return len(self.running) + len(self.prefilling)

    # --- step costs ---------------------------------------------------------------------

    def decode_step_time(self, n: int, context_tokens: float) -> float:
        k = self.cfg.num_speculative_tokens
        if not k:
            return self.costs.step(n, context_tokens)
        # The target verifies each sequence's k draft tokens with its own in one pass (k more
        # query tokens a sequence over the same cache), after the drafter has proposed them.
        step = self.costs.step(n, context_tokens, chunk=n * k)
        return step * (1.0 + self.cfg.draft_overhead)

    def mixed_step_time(
        self, n_dec: int, context_tokens: float, chunk: float, attn_flops_per_step: float
    ) -> float:
        return self.costs.step(n_dec, context_tokens, chunk, attn_flops_per_step)

    def attention_flops(self, done: int, todo: int) -> float:
        """FLOPs of attention for prefilling ``todo`` tokens after ``done`` cached ones."""
        return costs.attention_flops(self.spec, done, todo)

    # --- scheduling ---------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        self.waiting.append(req)

    def next_ready(self) -> float | None:
        return self.waiting[0].ready if self.waiting else None

    def _admit(self) -> None:
        """Schedule waiting requests while slots, KV blocks and this step's token budget last.

        As in vLLM's scheduler, a request leaves WAITING only when a step has room for (the
        first chunk of) its prefill, so a prefill backlog shows up as waiting requests.
        """
        cfg = self.cfg
        if not self.waiting or self.waiting[0].ready > self.clock:
            return
        # Free KV blocks, counted when a request first asks for them (a full batch or step
        # budget often stops the scheduler first; nothing changes the count before then).
        free: int | None = None
        budget = self.prefill_budget()
        budget -= sum(r.to_prefill - r.prefilled for r in self.prefilling)
        # As vLLM: a request whose adapter would exceed --max-loras is skipped (it keeps its
        # place at the head of the queue) and the scheduler looks at the next one.
        loras = self.adapters_in_use() if cfg.max_loras else set()
        skipped: list[Request] = []
        while self.waiting and self.waiting[0].ready <= self.clock:
            if self.num_running() >= cfg.max_num_seqs:
                break
            if budget <= 0 and self.prefilling:
                break
            req = self.waiting[0]
            if req.kv_failed:  # kv_load_failure_policy "fail" (vLLM's default): an error
                self._fail(self.waiting.popleft())
                continue
            if 0 <= req.adapter not in loras and 0 < cfg.max_loras <= len(loras):
                req.deferred = True
                skipped.append(self.waiting.popleft())
                continue
            need = self.blocks_for(req.prompt + req.generated + 1 + self._reserve(req))
            if free is None:
                free = self.num_blocks - self.used_blocks() - self._reserved_blocks()
            if need > free:
                break
            self.waiting.popleft()
            req.deferred = False
            if req.adapter >= 0:
                loras.add(req.adapter)
            free -= need
            if req.scheduled < 0:
                req.scheduled = self.clock
                self.stats.queue_times.append(self.clock - req.ready)
                share = max(cfg.prefix_hit_share, req.shared)
                hit = share if cfg.enable_prefix_caching else 0.0
                req.cached = req.first_cached = min(req.prompt - 1, int(req.prompt * hit))
                # Scheduler: prefix-cache stats are recorded at admission, new requests only.
                self.stats.prefix_queries += req.prompt
                self.stats.prefix_hits += req.cached
                if req.fetch_start >= 0:  # the KV arrived: all but the last prompt token
                    req.external = req.prompt - 1 - req.cached
                    req.cached = req.first_cached = req.prompt - 1
                    self.stats.transfers.append((req.ready - req.fetch_start, req.fetch_bytes))
                req.to_prefill = req.prompt - req.cached
            else:  # recompute after preemption: the prompt and what was generated
                cached = cfg.enable_prefix_caching and cfg.cached_recompute
                req.cached = self._still_cached(req) if cached else 0
                req.to_prefill = req.prompt + req.generated - req.cached
            req.prefilled = 0
            budget -= req.to_prefill
            self.prefilling.append(req)
        self.waiting.extendleft(reversed(skipped))

    def _reserve(self, req: Request, generated: int = -1) -> int:
        """Tokens kept free for a request's future output (SGLang's PrefillAdder: its
        remaining max_new_tokens, clipped at 4096, times new_token_ratio)."""
        left = req.max_tokens - (req.generated if generated < 0 else generated)
        return int(self.cfg.new_token_ratio * min(max(0, left), 4096))

    def _reserved_blocks(self) -> int:
        if not self.cfg.new_token_ratio:
            return 0
        run = self.running
        held = sum(self._reserve(r, int(g)) for r, g in zip(run.reqs, run.generated, strict=True))
        return self.blocks_for(held + sum(self._reserve(r) for r in self.prefilling))

    def adapters_in_use(self) -> set[int]:
        """The LoRA adapters of the requests in the running batch (prefilling or decoding)."""
        return {r.adapter for r in (*self.running.reqs, *self.prefilling) if r.adapter >= 0}

    def _still_cached(self, req: Request) -> int:
        """Tokens of a preempted request still cached when it is admitted again: vLLM frees
        its blocks tail first to the end of the LRU free queue (kv_cache_manager.free) and
        looks all its tokens but the last up on resuming (get_computed_blocks); new blocks
        come off the front, older free blocks first, then its own from the tail."""
        bs = self.cfg.block_size
        grown = self.used_blocks() - req.preempted_used
        evicted = max(0, grown - req.preempted_free)
        full = (req.prompt + req.generated - 1) // bs
        return max(0, full - evicted) * bs

    def _preempt_for(self, extra_tokens: int) -> None:
        """Preempt the newest running sequences until each can grow by ``extra_tokens``."""
        bs = self.cfg.block_size
        reserved = self._prefill_blocks() if self.prefilling else 0
        n = len(self.running)
        # An upper bound on the blocks every sequence needs after growing: if even that fits,
        # nobody is preempted (and the exact count is not needed).
        bound = self.running.context() // bs + n * (extra_tokens // bs + 2) + reserved
        if bound <= self.num_blocks:
            return
        while (
            len(self.running) and self.running.blocks(bs, extra_tokens) + reserved > self.num_blocks
        ):
            self.stats.usage_at_preemption.append(self.used_blocks() / self.num_blocks)
            victim = self.running.pop()
            victim.preempted_used = self.used_blocks()
            own = self.blocks_for(victim.prompt + victim.generated)
            victim.preempted_free = max(0, self.num_blocks - victim.preempted_used - own)
            self.stats.retractions.append((victim.prompt, victim.generated))
            victim.preemptions += 1
            victim.unreported_preemptions += 1
            self.waiting.appendleft(victim)

    def run_until(self, t_end: float) -> None:
        """Advance the engine clock to ``t_end`` (a long step may overrun it)."""
        while self.clock < t_end:
            self._admit()
            if self.prefilling:
                self._prefill_phase()
            elif len(self.running):
                self._decode_phase(t_end)
            else:
                nxt = self.next_ready()
                if nxt is None or nxt >= t_end:
                    self.clock = t_end
                elif self.waiting and nxt <= self.clock:
                    self.clock = t_end  # ready but cannot be admitted: nothing runs
                else:
                    self.clock = nxt

    def _prefill_phase(self) -> None:
        n_dec = len(self.running) if self.cfg.mixed_chunk else 0
        budget = self.prefill_budget()
        if budget <= 0:  # decodes fill the budget; prefill waits for a decode step
            self._decode_steps(1)
            return
        # Whole token counts: floats add them exactly, and cost less than arrays for few steps.
        todo = [float(r.to_prefill - r.prefilled) for r in self.prefilling]
        total = sum(todo)
        steps = max(1, math.ceil(total / budget))
        attn = sum(
            self.attention_flops(r.cached + r.prefilled, r.to_prefill - r.prefilled)
            for r in self.prefilling
        )
        # Every step but the last fills the budget; the last carries what is left, so a prompt
        # just over the budget costs one full step and a short one, as vLLM schedules it.
        ctx = self.running.context()
        last = total - budget * (steps - 1)
        full_time = self.mixed_step_time(n_dec, ctx, budget, attn * budget / max(total, 1.0))
        last_time = self.mixed_step_time(n_dec, ctx, last, attn * last / max(total, 1.0))
        start = self.clock
        ends = [start + k * full_time for k in range(1, steps)] + [
            start + (steps - 1) * full_time + last_time
        ]
        done_at_step = [max(1, math.ceil(c / budget)) for c in itertools.accumulate(todo)]
        decoded: list[float] = []
        if n_dec and steps > 1:
            decoded = self._decoded_list(steps - 1, full_time)
            self.clock = ends[-2]
        if n_dec and len(self.running):  # everyone may have finished in the full steps
            decoded += self._decoded_list(1, last_time)
        decoded += [0.0] * (steps - len(decoded))
        self.clock = ends[-1]
        st = self.stats
        st.busy_seconds += ends[-1] - start
        if not self.cfg.mixed_chunk and len(self.running):
            self.stall += ends[-1] - start
            self.stalled = len(self.running)
        # Each step's output message: decode tokens, plus a first (or resumed) token and the
        # prompt of every request whose prefill ends in it.
        outputs, computed, full = decoded, [0.0] * steps, [0.0] * steps
        joined: list[Request] = []
        for req, k in zip(self.prefilling, done_at_step, strict=True):
            t = ends[k - 1]
            req.prefilled = req.to_prefill
            outputs[k - 1] += 1
            if req.generated == 0:
                req.first_token = t
                req.generated = 1
                st.generation_tokens += 1
                # IterationStats.update_from_output, is_prefilling: TTFT and the prompt.
                st.ttft.append(t - req.arrival)
                st.prompt_tokens += req.prompt
                st.cached_tokens += req.first_cached
                st.external_tokens += req.external
                st.prefills.append((t - req.scheduled, int(k)))
                computed[k - 1] += req.prompt - req.first_cached
                full[k - 1] += req.prompt
            else:  # resumed after preemption: the stall shows as one long token gap
                st.itl.append((t - req.last_token, 1))
                # PREEMPTED events travel with the request's next output.
                st.preemptions += req.unreported_preemptions
                req.unreported_preemptions = 0
            req.last_token = t
            if req.generated >= req.target_out:
                self._finish(req, t)
            else:
                joined.append(req)
        self.running.add_all(joined)
        self.prefilling = []
        out = [i for i, o in enumerate(outputs) if o > 0]
        st.batches.append(_counted_list([outputs[i] + computed[i] for i in out]))
        st.batches_full_prompt.append(_counted_list([outputs[i] + full[i] for i in out]))

    def _decoded_list(self, steps: int, step_time: float) -> list[float]:
        """Every running sequence gets one token per step; finishing ones stop early.

        Returns the tokens each of the ``steps`` output."""
        n = len(self.running)
        if self._decode_uniformly(steps, step_time):
            return [float(n)] * steps
        per_step: list[float] = self._emit_unevenly(steps, step_time).tolist()
        return per_step

    def _decode_uniformly(self, steps: int, step_time: float) -> bool:
        """The common case: nobody finishes within the steps, so every step outputs a token
        for every sequence. False, and nothing done, otherwise."""
        run = self.running
        if self.cfg.num_speculative_tokens or run.min_left() <= steps:
            return False
        n = len(run)
        self.stats.itl.append((step_time, n * steps))
        self.stats.generation_tokens += n * steps
        run.grow_each(steps)
        run.last.fill(self.clock + steps * step_time)
        return True

    def _emit_unevenly(self, steps: int, step_time: float) -> np.ndarray:
        """The steps when a sequence finishes within them, or with speculative decoding (a
        step may give a sequence several tokens): the tokens each step output."""
        run = self.running
        if self.cfg.num_speculative_tokens:
            got, finished_at, per_step = speculate(
                self.rng, run, self.cfg.num_speculative_tokens, steps, self.stats
            )
            tokens = int(got.sum())
            observed = int(finished_at.sum())
        else:
            got = np.minimum(run.target - run.generated, steps)
            finished_at = got
            tokens = observed = int(got.sum())
            # Step j (1-based) outputs a token for every sequence with at least j left.
            if tokens == len(got) * steps:  # nobody finishes within the steps
                per_step = np.full(steps, len(got))
            else:
                per_step = len(got) - np.searchsorted(np.sort(got), np.arange(1, steps + 1))
        # One ITL observation per sequence and step, however many tokens the step gave it;
        # the first step after a prefill run alone carries the prefill's time for every stream.
        stalled = min(self.stalled, len(got))
        if self.stall and stalled:
            self.stats.itl.append((step_time + self.stall, stalled))
            observed -= stalled
        self.stall, self.stalled = 0.0, 0
        if observed:
            self.stats.itl.append((step_time, observed))
        self.stats.generation_tokens += tokens
        run.grow(got, tokens)
        done = run.generated >= run.target
        finished = done.nonzero()[0]
        if finished.size:
            start = self.clock
            generated, at = run.generated.tolist(), finished_at.tolist()
            context = run.context()
            for i in finished.tolist():
                req = run.reqs[i]
                req.generated = generated[i]
                context -= req.prompt + req.generated
                self._finish(req, start + at[i] * step_time)
            run.keep(~done, context)
        # Sequences still running saw their last token at the end of the steps.
        run.last.fill(self.clock + steps * step_time)
        return per_step.astype(np.float64)

    def _decode_phase(self, t_end: float) -> None:
        nxt = self.next_ready()
        horizon = min(t_end, self.clock + self.cfg.phase_quantum)
        if nxt is not None and nxt > self.clock:
            horizon = min(horizon, nxt)
        step = self.decode_step_time(len(self.running), self.running.context())
        steps = max(1, int((horizon - self.clock) / step))
        self._decode_steps(steps, step)

    def _decode_steps(self, steps: int, step: float | None = None) -> None:
        k = self.cfg.num_speculative_tokens
        if k and len(self.running):  # up to k more a step, and k lookahead slots
            self._preempt_for(steps + k + int(steps * k * float(self.running.accept.mean())))
        else:
            self._preempt_for(steps)
        if not len(self.running):
            return
        if step is None:
            step = self.decode_step_time(len(self.running), self.running.context())
        n = len(self.running)
        if self._decode_uniformly(steps, step):  # what _counted makes of n at every step
            observed = (np.array([float(n)]), np.array([float(steps)]))
        else:
            observed = _counted(self._emit_unevenly(steps, step))
        self.stats.batches.append(observed)
        self.stats.batches_full_prompt.append(observed)
        self.clock += steps * step
        self.stats.busy_seconds += steps * step

    def _fail(self, req: Request) -> None:
        """A request whose KV never arrived: finished with an error, no token."""
        req.last_token = self.clock
        req.outcome = "error"
        self.stats.errors.append(req)

    def _finish(self, req: Request, t: float) -> None:
        req.last_token = t
        req.outcome = "finished"
        self.stats.finished.append(req)

    def drain(self) -> EngineStats:
        out, self.stats = self.stats, EngineStats()
        return out

    def abort_all(self) -> list[Request]:
        """A crash: every request in the engine is lost."""
        lost = [*self.waiting, *self.prefilling, *self.running.reqs]
        self.waiting.clear()
        self.prefilling, self.running = [], Batch()
        return lost


def _counted_list(values: list[float]) -> tuple[np.ndarray, np.ndarray]:
    """``_counted`` of a list of floats, deciding before making the arrays."""
    if values and values.count(values[0]) == len(values):
        return np.array(values[:1]), np.array([float(len(values))])
    return np.array(values, dtype=np.float64), np.ones(len(values))


def _counted(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The values with how often each occurs (histograms take weighted observations): one
    value and its count when all are equal (a run of decode steps), else each once (a
    prefill's few steps, where counting distinct values cost more than it saved)."""
    if values.size and values[0] == values[-1] and (values == values[0]).all():
        return values[:1], np.array([float(values.size)])
    return values, np.ones(values.size)
