"""How the receiver stops: on any signal that would end the process, after a drain.

Every alert the receiver answered 200 for must end with a record. A signal whose default
action ends the process (SIGTERM from a container runtime, SIGINT from Ctrl-C, SIGHUP from a
closed terminal, SIGQUIT, SIGUSR1 and the rest of ``stop_signals``) would end it on the spot,
with the queue in memory; so each of them starts the drain instead (``webhook.http.serve``).
A second signal during the drain ends the drain at once, the alerts left recorded as undone
with that signal named; the process then exits 128 + its number, as the shell reports a
process a signal ended, so a supervisor knows the stop was forced.

SIGKILL and SIGSTOP cannot be caught: a runtime that sends SIGKILL before the drain ends
(``docker stop`` after the container's grace period) loses what was left, which is why the
default drain fits in Docker's grace. Faults (SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT,
SIGSYS, SIGTRAP) are a crash, not a request to stop, and SIGPIPE is ignored by Python already
(a closed pipe is an error on the write).

The handler only sets attributes: Python runs it in the main thread between two bytecodes,
possibly while that thread holds a lock the handler would need (an ``Event``'s), so it takes
none, and the main thread polls.
"""

from __future__ import annotations

import signal
from types import FrameType

# Signals whose default action ends the process and that say nothing is wrong with it.
_ENDING = (
    "SIGHUP",
    "SIGINT",
    "SIGQUIT",
    "SIGTERM",
    "SIGUSR1",
    "SIGUSR2",
    "SIGALRM",
    "SIGVTALRM",
    "SIGPROF",
    "SIGXCPU",
    "SIGPWR",
    "SIGIO",
    "SIGSTKFLT",
)


def stop_signals() -> list[int]:
    """The signals that stop the receiver with a drain, on this platform: the named ones
    above and the real-time ones (whose default also ends the process)."""
    out = {int(getattr(signal, name)) for name in _ENDING if hasattr(signal, name)}
    if hasattr(signal, "SIGRTMIN"):
        out |= set(range(signal.SIGRTMIN, signal.SIGRTMAX + 1))
    return sorted(out)


def signal_name(signum: int) -> str:
    """``SIGTERM``, ``SIGRTMIN+3``, or ``signal N``."""
    if hasattr(signal, "SIGRTMIN") and signal.SIGRTMIN < signum < signal.SIGRTMAX:
        return f"SIGRTMIN+{signum - signal.SIGRTMIN}"
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class _Flag:
    """A flag with ``is_set``, like ``threading.Event``'s, that a signal handler may set."""

    def __init__(self) -> None:
        self.value = False

    def is_set(self) -> bool:
        return self.value


class SignalStop:
    """The signals received: ``requested`` after the first (drain), ``forced`` after the
    second (end the drain now). ``install`` replaces the handlers of ``stop_signals``.
    ``is_set``, ``why`` and ``cut`` are what ``serve`` and ``Webhook.drain`` ask."""

    def __init__(self) -> None:
        self.requested = _Flag()
        self.forced = _Flag()
        self.received: list[int] = []

    def install(self) -> None:
        for signum in stop_signals():
            try:
                signal.signal(signum, self._on)
            except (OSError, ValueError):  # one the platform reserves
                continue

    def _on(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self.requested.value:
            self.forced.value = True
        else:
            self.requested.value = True

    def is_set(self) -> bool:
        return self.requested.value

    def why(self) -> str:
        """What stopped the receiver: ``on SIGTERM``."""
        return f"on {signal_name(self.received[0])}" if self.received else ""

    def cut(self) -> str | None:
        """Why the drain ended early (``a second signal (SIGINT)``), or None."""
        forcing = self.forcing()
        return None if forcing is None else f"a second signal ({signal_name(forcing)})"

    def forcing(self) -> int | None:
        """The number of the signal that ended the drain early, or None."""
        return self.received[1] if self.forced.value and len(self.received) > 1 else None
