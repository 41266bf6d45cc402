"""JSON text from a client is bounded before it is parsed (policy_server.foundation.json_text), sans I/O."""

from __future__ import annotations

import json
import time

import pytest

from policy_server.foundation.json_text import MAX_JSON_DEPTH, JsonTextError, json_depth, loads_bounded


def test_depth_is_counted_outside_strings():
    assert json_depth(b'{"a": [1, {"b": []}]}') == 4
    assert json_depth(b'["[[[[{{{{", "\\"[[[["]') == 1  # brackets and escaped quotes inside strings
    assert json_depth(b"3") == 0
    assert json_depth(b'["unterminated [[[[') == 1  # as the parser reads it: a string to the end, then an error


def test_deep_text_is_refused_before_python_recurses():
    deep = '{"a":' * 12_000 + "1" + "}" * 12_000  # 72 kB; json.loads raises RecursionError on it
    with pytest.raises(RecursionError):
        json.loads(deep)
    with pytest.raises(JsonTextError, match="nests 12000 deep") as raised:
        loads_bounded(deep, max_bytes=100_000)
    assert raised.value.too_large
    assert loads_bounded("[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, 1000) == eval("[" * 31 + "[]" + "]" * 31)


def test_size_elements_and_syntax_are_each_refused_by_name():
    with pytest.raises(JsonTextError, match="at most 10 are accepted") as raised:
        loads_bounded('{"a": "' + "x" * 20 + '"}', max_bytes=10)
    assert raised.value.too_large
    with pytest.raises(JsonTextError, match="elements"):
        loads_bounded(json.dumps(list(range(100))), max_bytes=10_000, max_values=50)
    with pytest.raises(JsonTextError, match="not valid JSON") as raised:
        loads_bounded('{"a": ', max_bytes=100)
    assert not raised.value.too_large
    assert loads_bounded('{"type": "subscribe", "x": "]]}}"}', max_bytes=100) == {"type": "subscribe", "x": "]]}}"}


def test_the_string_scan_stays_linear_on_hostile_quotes():
    """Escaped quotes outside any string and an unterminated last one: a backtracking pattern is quadratic.
    Four times the input takes about four times as long (a quadratic scan: sixteen), the best of five runs
    of each (a millisecond or so) measured side by side, so a loaded core slows both alike."""

    def best_of_five(count: int) -> float:
        hostile = '\\"' * count + "\\"
        times = []
        for _ in range(5):
            started = time.perf_counter()
            with pytest.raises(JsonTextError):
                loads_bounded(hostile, max_bytes=10**6)
            times.append(time.perf_counter() - started)
        return min(times)

    ratio = best_of_five(40_000) / best_of_five(10_000)
    assert ratio < 8, ratio
