"""Prometheus answers read as the bytes they are (``plumbing.answer``): the series ``json``
gives, whatever the layout, for every valid answer; one line for what is not one; and the
memory a read draws, in proportion to its points, within its deadline."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pytest

from diagnoser.plumbing import http
from diagnoser.plumbing.answer import PIECE, BadAnswer, decode


def _answer(*series: dict, **top: object) -> bytes:
    doc = {"status": "success", "data": {"resultType": "matrix", "result": list(series)}}
    return json.dumps({**doc, **top}).encode()


def _one(values: bytes) -> bytes:
    """An answer of one series whose points are ``values`` (JSON text)."""
    return b'{"status":"success","data":{"result":[{"metric":{},"values":' + values + b"}]}}"


def _by_json(body: bytes) -> list[tuple[dict[str, str], list[float], list[float]]]:
    out = []
    for r in json.loads(body)["data"]["result"]:
        pts = r["values"] if "values" in r else [r["value"]]
        out.append((r["metric"], [float(p[0]) for p in pts], [float(p[1]) for p in pts]))
    return out


VALUES = [[1_700_000_000, "1"], [1_700_000_015.5, "NaN"], [1_700_000_030, "+Inf"]]
VALUES += [[1_700_000_045, "-Inf"], [1_700_000_060, "1e-05"], [1_700_000_075, "-0.25"]]
MANY = [[1_700_000_000 + k, str(k / 3)] for k in range(PIECE // 12)]  # more than a piece
ODD_LABELS = {'é"/\\': "\u202e\n\u00e9", "long": "x" * (1 << 20)}


@pytest.mark.parametrize(
    "body",
    [
        _answer({"metric": {"a": "b"}, "values": VALUES}),
        json.dumps(  # pretty-printed, its keys in another order
            {"data": {"result": [{"values": VALUES, "metric": {"a": "b"}}]}, "status": "success"},
            indent=2,
        ).encode(),
        _answer({"metric": ODD_LABELS, "values": [[1, 2], [3, 4.5]]}),  # escapes, numbers
        _answer(  # an instant vector, and a native histogram beside a point
            {"metric": {}, "value": [1_700_000_000.25, "7"]},
            {"metric": {"h": "1"}, "value": [1, "2"], "histogram": [1, {"count": "3"}]},
        ),
        _answer({"metric": {}, "values": MANY}),
        _answer({"metric": {}, "values": []}),
    ],
    ids=["compact", "pretty", "escaped", "instant", "pieces", "empty"],
)
def test_an_answer_gives_the_series_json_gives(body):
    got = decode(body).result
    want = _by_json(body)
    assert got is not None and len(got) == len(want)
    for (labels, t, v), (w_labels, w_t, w_v) in zip(got, want, strict=True):
        assert labels == w_labels
        assert t.tolist() == w_t
        assert np.array_equal(v, np.array(w_v), equal_nan=True)


@pytest.mark.parametrize(
    ("body", "series"),
    [
        (b"<html>login</html>", False),
        (b'{"status": "success"} trailing', False),
        (b'{"status": "success", "x": ' + b"[" * 100 + b"]" * 100 + b"}", False),
        (b'{"status":"success","data":{"result":["a string"]}}', True),
        (b'{"status":"success","data":{"result":[{"values":[[1,"1"]]}]}}', True),
        (b'{"status":"success","data":{"result":[{"metric":{}}]}}', True),
        (b'{"status":"success","data":{"result":[{"metric":null,"values":[]}]}}', True),
        (b'{"status":"success","data":{"result":[{"metric":{"a":1},"values":[]}]}}', True),
        (_one(b'[[true,"1"]]'), True),
        (_one(b"[[1,false]]"), True),
        (_one(b'[[1,"x"]]'), True),
        (_one(b'[[1,"NaNa"]]'), True),
        (_one(b'[[NaN,"1"]]'), True),
        (_one(b'[[1,"1",2]]'), True),
        (_one(b'[[[1],"1"]]'), True),
        (_one(b'"x"'), True),
        # Integers of hundreds and thousands of digits: float() overflowed on them (a
        # traceback), or json refused them.
        (_one(b"[[" + b"9" * 400 + b',"1"]]'), True),
        (_one(b"[[1," + b"9" * 400 + b"]]"), True),
        (_one(b"[[1," + b"9" * 5000 + b"]]"), True),
    ],
)
def test_what_is_not_an_answer_is_said(body, series):
    with pytest.raises(BadAnswer) as err:
        decode(body)
    assert err.value.series is series


def test_a_value_written_with_hundreds_of_digits_is_infinite_as_float_reads_it():
    result = decode(_one(b'[[1,"' + b"9" * 400 + b'"]]')).result
    assert result is not None and math.isinf(result[0][2][0])


def test_the_status_error_and_warnings_are_read():
    body = {"status": "error", "errorType": "execution", "error": "query timed out"}
    answer = decode(json.dumps({**body, "warnings": ["partial", 3, "store down"]}).encode())
    assert answer.status == "error" and answer.result is None
    assert (answer.error_type, answer.error) == ("execution", "query timed out")
    assert answer.warnings == ["partial", "store down"]


def test_reading_draws_memory_in_proportion_to_the_points_and_stops_at_the_deadline():
    points = [[1_700_000_000 + 15 * k, f"{k / 7:.4f}"] for k in range(1000)]
    body = _answer(*({"metric": {"pod": f"p{i}"}, "values": points} for i in range(100)))
    budget = http.Budget(1 << 30)
    with budget.lease(time.monotonic() + 60, 1 << 30) as lease:
        decode(body, lease=lease)
        assert 16 * 100_000 <= lease.held < len(body)  # json took about ten times the body
    assert budget.used == 0
    with pytest.raises(http.TooLarge):
        decode(body, lease=budget.lease(time.monotonic() + 60, len(body) // 4))
    with pytest.raises(http.TimedOut):
        decode(body, at=time.monotonic() - 1)


def test_series_with_the_same_times_share_one_read_only_array():
    """A range query's series share their grid: one array of it, not one per series; a
    series with other times (a gap) keeps its own, and no reader can change a shared one."""
    gap = [p for k, p in enumerate(MANY) if k != 7]
    body = _answer(
        {"metric": {"pod": "a"}, "values": MANY},
        {"metric": {"pod": "b"}, "values": MANY},
        {"metric": {"pod": "c"}, "values": gap},
        {"metric": {"pod": "d"}, "values": MANY},
    )
    got = decode(body).result
    assert got is not None
    (_, ta, _), (_, tb, _), (_, tc, _), (_, td, _) = got
    assert ta is tb and tc is not ta and len(tc) == len(ta) - 1
    assert td.tolist() == ta.tolist()
    assert not ta.flags.writeable and not tc.flags.writeable
    assert [t.tolist() for _, t, _ in got] == [t for _, t, _ in _by_json(body)]
