"""The lab's load: open-loop Poisson arrivals of ``/v1/completions`` requests, bounded.

Each request draws its prompt and answer lengths from log-normal distributions around the
phase's medians. The answer length is made exact with vLLM's own sampling parameters:
``min_tokens`` holds the end-of-turn token back until the drawn length, and a ``logit_bias``
of +100 on it then ends the answer there, with ``finished_reason="stop"``, as a real model's
answer ends; a drawn length at or over ``max_tokens`` ends on the cap (``"length"``).

Bounded in count and time: at most ``max_in_flight`` requests at once (an arrival beyond it
is counted and not sent), each with a timeout, and nothing is sent after ``stop()``.
"""

from __future__ import annotations

import json
import math
import random
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass

from lab.real.model import EOS, prompt

REQUEST_TIMEOUT = 120.0
SYSTEM_SEED = 20261202  # the shared system prompt's words


@dataclass(frozen=True)
class LoadSpec:
    """One phase's traffic. ``rate`` 0 sends nothing."""

    rate: float  # requests per second, Poisson
    prompt: int = 150  # median prompt tokens
    output: int = 60  # median answer tokens
    max_tokens: int = 512
    sigma: float = 0.3  # log-normal spread of both lengths
    long_share: float = 0.0  # share of requests with a long prompt instead
    long_prompt: int = 0  # their prompt tokens
    # Words of a system prompt every request starts with (the same text in every phase), which
    # the prefix cache can serve; and words of unique text put ahead of it (a timestamp or a
    # request id a template added), after which nothing of the prompt can hit.
    shared_prefix: int = 0
    unique_head: int = 0
    # Sampling temperature sent with each request (None: the server's default, 1.0). 0 is
    # greedy: the tiny model's answers then repeat themselves, which n-gram drafting guesses.
    temperature: float | None = None
    # 1: end each answer at its drawn length with max_tokens and ignore_eos instead (vLLM
    # refuses logit_bias with speculative decoding); every answer then ends on "length".
    ignore_eos: int = 0
    # LoRA: each request names one of this many adapters (lora-00, lora-01, ...), evenly at
    # random; 0 sends every request to the base model. The incident's ``adapters`` serves them.
    adapters: int = 0
    # With an incident's ``replicas``: the share of requests sent to the first server (the
    # rest spread evenly over the others); 0 spreads every request evenly, as a load-aware or
    # random router would. Session affinity on a heavy tenant sends more to one.
    hot_share: float = 0.0

    def draw(self, rng: random.Random) -> tuple[int, int]:
        """(prompt words, answer tokens) for one request."""
        if self.long_share and rng.random() < self.long_share:
            words = self.long_prompt
        else:
            words = round(self.prompt * math.exp(rng.gauss(0.0, self.sigma)))
        out = round(self.output * math.exp(rng.gauss(0.0, self.sigma)))
        return max(1, words - 1), max(1, out)


class Load:
    """``load.start(spec)``, ``load.set(spec)`` per phase, ``load.stop()`` at the end."""

    def __init__(self, url: str, model: str, seed: int, max_in_flight: int = 256):
        self.url = f"{url}/v1/completions"
        self.replicas: list[str] = []  # the other servers' base URLs
        self.model = model
        self.rng = random.Random(seed)
        self._system: dict[int, str] = {}
        self.spec = LoadSpec(rate=0.0)
        self.outcomes: Counter[str] = Counter()
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._workers: list[threading.Thread] = []

    def start(self, spec: LoadSpec) -> None:
        self.spec = spec
        self._thread = threading.Thread(target=self._arrivals, name="load", daemon=True)
        self._thread.start()

    def set(self, spec: LoadSpec) -> None:
        self.spec = spec

    def stop(self, drain: float = 30.0) -> None:
        """No new request; wait up to ``drain`` seconds for those in flight."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        deadline = time.monotonic() + drain
        for w in self._workers:
            w.join(max(0.0, deadline - time.monotonic()))

    def _arrivals(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            spec = self.spec
            if spec.rate <= 0:
                self._stop.wait(0.5)
                next_at = time.monotonic()
                continue
            next_at += self.rng.expovariate(spec.rate)
            delay = next_at - time.monotonic()
            if delay > 0 and self._stop.wait(delay):
                return
            words, out = spec.draw(self.rng)
            name = f"lora-{self.rng.randrange(spec.adapters):02d}" if spec.adapters else self.model
            body: dict[str, object] = {"model": name, "prompt": self.text(spec, words)}
            if spec.ignore_eos:
                body.update(max_tokens=min(out, spec.max_tokens), ignore_eos=True)
            else:
                body.update(
                    max_tokens=spec.max_tokens,
                    min_tokens=min(out, spec.max_tokens),
                    logit_bias={str(EOS): 100},
                )
            if spec.temperature is not None:
                body["temperature"] = spec.temperature
            if not self._slots.acquire(blocking=False):
                self._count("client_overflow")
                continue
            target = self._route(spec)
            w = threading.Thread(
                target=self._send, args=(target, json.dumps(body).encode()), daemon=True
            )
            self._workers = [x for x in self._workers if x.is_alive()]
            self._workers.append(w)
            w.start()

    def text(self, spec: LoadSpec, words: int) -> str:
        """A request's prompt: the unique head, the shared system prompt, the user's words."""
        parts = [prompt(spec.unique_head, self.rng)] if spec.unique_head else []
        if spec.shared_prefix:
            system = self._system.get(spec.shared_prefix)
            if system is None:  # the same text whatever the phase or the seed
                system = self._system[spec.shared_prefix] = prompt(
                    spec.shared_prefix, random.Random(SYSTEM_SEED)
                )
            parts.append(system)
        parts.append(prompt(words, self.rng))
        return " ".join(parts)

    def _route(self, spec: LoadSpec) -> str:
        """The server a request goes to: the first for ``hot_share`` of them, else any."""
        if not self.replicas:
            return self.url
        if spec.hot_share and self.rng.random() < spec.hot_share:
            return self.url
        urls = [self.url, *(f"{u}/v1/completions" for u in self.replicas)]
        if spec.hot_share:
            urls = urls[1:]
        return urls[self.rng.randrange(len(urls))]

    def _send(self, url: str, body: bytes) -> None:
        try:
            req = urllib.request.Request(url, body, {"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT) as resp:
                resp.read()
                self._count(f"http_{resp.status // 100}xx")
        except urllib.error.HTTPError as exc:
            self._count(f"http_{exc.code // 100}xx")
        except (urllib.error.URLError, OSError, ValueError) as exc:
            self._count("timeout" if "timed out" in str(exc) else "connection_error")
        finally:
            self._slots.release()

    def _count(self, what: str) -> None:
        with self._lock:
            self.outcomes[what] += 1
