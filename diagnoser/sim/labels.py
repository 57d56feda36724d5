"""A scenario's labels: what ``diagnose`` must say about its window, and the judging of it.

``expect`` names the playbooks that must be current findings at the window's end, the likely
cause first; ``absent`` those that must not be reported as causes; ``resolved`` those whose
incident ended inside the window: each must be reported resolved (``Diagnosis.resolved``) and
none of them may be current; ``ended`` those whose incident ended shortly before the window's
end, perhaps before it began (a short window read after a recovery): whether reported resolved
or as ended before the window, none may be current. A scenario with none of ``expect``,
``resolved`` and ``ended`` is healthy: no finding at all. One with no ``expect`` but an
incident that ended is a recovery: nothing current.

The judging takes playbook ids, not a diagnosis, so the simulator's package needs nothing of
the diagnosis's: the bench and the tests hand it the ids of ``result.findings`` and
``result.resolved`` (or of the JSON's ``findings`` and ``resolved``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Expectation:
    window: float = 3600.0
    expect: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    resolved: tuple[str, ...] = ()
    ended: tuple[str, ...] = ()

    @property
    def healthy(self) -> bool:
        """No incident in or just before the window, current or ended: nothing may be found."""
        return not self.expect and not self.resolved and not self.ended

    @property
    def recovered(self) -> bool:
        """Every incident the labels name has ended: nothing may be current."""
        return not self.expect and not self.healthy

    @property
    def kind(self) -> str:
        """incident (something is current), recovery or healthy."""
        return "incident" if self.expect else ("recovery" if self.recovered else "healthy")

    def misses(self, findings: Sequence[str], resolved: Sequence[str] = ()) -> list[str]:
        """What a diagnosis whose current findings are ``findings`` (playbook ids, in its
        order) and whose resolved ones are ``resolved`` got wrong, one short sentence each;
        empty when it says what the labels say. ``absent`` is judged apart (on causes only)."""
        out = []
        found = list(findings)
        if not self.expect and found:
            out.append(f"{self.kind}, yet current: {', '.join(found)}")
        if self.expect:
            if not found:
                out.append(f"nothing current; expected {self.expect[0]} first")
            elif found[0] != self.expect[0]:
                out.append(f"expected {self.expect[0]} first, got {', '.join(found[:3])}")
            out += [f"{pid} not current" for pid in self.expect[1:] if pid not in found]
        for pid in self.resolved:
            if pid in found:
                out.append(f"{pid} still current, expected resolved")
            elif pid not in resolved:
                out.append(f"{pid} not reported resolved")
        out += [f"{pid} still current, expected ended" for pid in self.ended if pid in found]
        return out
