"""The one way into a diagnosis: a scope's matchers built in one place, the window planned from
the request, and the request's deadline holding for the whole diagnosis (a real server on
loopback that answers each query slowly)."""

from __future__ import annotations

import pytest
from loopback import EMPTY, answer, elapsed, serve

from diagnoser.diagnosis.window import Window
from diagnoser.plumbing.source import PrometheusSource, SourceError
from diagnoser.request import Request, Scope, ScopeError, run

END = 1_800_000_000.0


def test_a_scope_escapes_every_value_and_keeps_matchers_as_given(site):
    scope = Scope(
        model='a"} or vector(1) or {b="',
        job="vllm",
        match=(' pod=~"vllm-.*" ',),
        labels=(("cluster", "east\n"),),
    )
    assert scope.matchers() == (
        'model_name="a\\"} or vector(1) or {b=\\""',
        'job="vllm"',
        'cluster="east\\n"',
        'pod=~"vllm-.*"',
    )


@pytest.mark.parametrize(
    ("kwargs", "said"),
    [
        ({"match": ('job="x"} or up{',)}, "match 'job=\"x\"} or up{' is not a label matcher"),
        ({"match": ("foo",)}, "match 'foo' is not a label matcher like job=\"vllm\""),
        ({"model": "bad\udcff"}, "model: the value is not valid UTF-8 text"),
        ({"instance": 3}, "instance: 3 is not text"),
    ],
)
def test_a_malformed_scope_is_refused_in_one_line_naming_its_field(kwargs, said):
    with pytest.raises(ScopeError) as exc:
        Scope(**kwargs)
    assert str(exc.value).startswith(said) and "\n" not in str(exc.value)


def test_the_window_is_planned_from_the_request(site):
    source = PrometheusSource("http://127.0.0.1:1")
    plain = Request(source, site, 3600, until=END)
    assert plain.window() == Window.plan(3600, END)
    shifted = Request(source, site, 3600, until=END, baseline=86400)
    assert shifted.window().baseline == (END - 3600 - 86400, END - 86400)
    fine = Request(source, site, 600, step=5)
    assert fine.window(now=END) == Window.plan(600, END).with_step(5)


def test_the_requests_deadline_bounds_the_whole_diagnosis(site):
    """Each query answers in 1.5 s; the source's own 60 s would let the ~60 queries run on, the
    request's 2 s stops them all."""

    def slow(h, f):
        if not f.release.wait(1.5):
            answer(h, EMPTY)

    with serve(slow) as api:
        source = PrometheusSource(api.url, timeout=60)
        took, raised = elapsed(lambda: _raised(Request(source, site, 3600, timeout=2)))
    assert isinstance(raised, SourceError) and "within 2 s" in str(raised)
    assert source.timeout == 60  # the caller's source is left as it was
    assert took < 30


def _raised(request: Request) -> Exception | None:
    try:
        run(request)
    except Exception as exc:  # the test looks at what was raised
        return exc
    return None
