"""logprobs_frame / top_logprobs_frame on small hand-checked cases."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pandas as pd
import pytest
from helpers.frames import logprob, message, response, stream, tool_call

from nbresponses.frames import (
    LOGPROBS_COLUMNS,
    TOP_LOGPROBS_COLUMNS,
    logprobs_frame,
    top_logprobs_frame,
)

L = math.log


def _dtypes(frame: pd.DataFrame) -> dict[str, str]:
    return {name: str(dtype) for name, dtype in frame.dtypes.items()}


def _three_alternatives() -> object:
    """'A' chosen at p=.6 over B (.3) and C (.05); then 'D' sampled outside the top 2."""
    return response(
        message(
            [
                [
                    logprob("A", L(0.6), [("A", L(0.6)), ("B", L(0.3)), ("C", L(0.05))]),
                    logprob("D", L(0.01), [("A", L(0.7)), ("B", L(0.2))]),
                    logprob("E", L(0.2), [("F", L(0.5)), ("E", L(0.2)), ("G", L(0.2))]),
                ]
            ]
        )
    )


def test_schema_and_index() -> None:
    frame = logprobs_frame(_three_alternatives())
    assert _dtypes(frame) == LOGPROBS_COLUMNS
    # what a reader looks at first opens the frame; the long ids come last
    assert list(frame.columns) == list(LOGPROBS_COLUMNS)
    assert list(frame.columns[:2]) == ["token", "prob"]
    assert list(frame.columns[-2:]) == ["response_id", "item_id"]
    assert isinstance(frame.index, pd.RangeIndex)
    assert _dtypes(top_logprobs_frame(_three_alternatives())) == TOP_LOGPROBS_COLUMNS


def test_rank_runner_up_margin_entropy_by_hand() -> None:
    f = logprobs_frame(_three_alternatives())
    assert f["rank"].tolist() == [1, pd.NA, 2]
    assert f["runner_up"].tolist() == ["B", "A", "F"]
    assert f["margin"].tolist() == pytest.approx([L(2), L(0.01 / 0.7), L(0.2 / 0.5)])
    entropy0 = -(0.6 * L(0.6) + 0.3 * L(0.3) + 0.05 * L(0.05))
    entropy1 = -(0.7 * L(0.7) + 0.2 * L(0.2))
    entropy2 = -(0.5 * L(0.5) + 2 * 0.2 * L(0.2))
    assert f["topk_entropy"].tolist() == pytest.approx([entropy0, entropy1, entropy2])
    assert f["topk_mass"].tolist() == pytest.approx([0.95, 0.9, 0.9])
    assert f["n_top"].tolist() == [3, 2, 3]
    assert f["prob"].tolist() == pytest.approx([0.6, 0.01, 0.2])
    assert f["position"].tolist() == [0, 1, 2]


def test_top_logprobs_long_form() -> None:
    t = top_logprobs_frame(_three_alternatives())
    assert len(t) == 8
    assert t["position"].tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    # ties keep API order: E and G both at .2, E came first
    assert t["rank"].tolist() == [1, 2, 3, 1, 2, 1, 2, 3]
    assert t["chosen"].tolist() == [True, False, False, False, False, False, True, False]
    assert t["prob"].tolist() == pytest.approx([0.6, 0.3, 0.05, 0.7, 0.2, 0.5, 0.2, 0.2])
    chosen = t[t["chosen"]].merge(logprobs_frame(_three_alternatives()), on="position")
    assert (chosen["rank_x"].to_numpy() == chosen["rank_y"].to_numpy()).all()


def test_unsorted_alternatives_are_ranked_by_logprob() -> None:
    r = response(message([[logprob("x", L(0.2), [("y", L(0.1)), ("x", L(0.2)), ("z", L(0.7))])]]))
    assert logprobs_frame(r)["rank"].tolist() == [2]
    assert top_logprobs_frame(r)["rank"].tolist() == [3, 2, 1]
    assert logprobs_frame(r)["runner_up"].tolist() == ["z"]


def test_no_alternatives_gives_missing_statistics() -> None:
    f = logprobs_frame(response(message([[logprob("a", -0.5)]])))
    assert f["rank"].isna().all() and f["runner_up"].isna().all()
    assert np.isnan(f[["margin", "topk_entropy", "topk_mass", "runner_up_logprob"]]).all(axis=None)
    assert f["n_top"].tolist() == [0]


def test_multibyte_tokens_rebuild_text_and_offsets() -> None:
    raw = "é世".encode()  # c3 a9 | e4 b8 96
    entries = [logprob(raw[:1], -0.1), logprob(raw[1:3], -0.2), logprob(raw[3:], -0.3)]
    f = logprobs_frame(response(message([entries])))
    assert f["text"].tolist() == ["", "é", "世"]
    assert f["char_offset"].tolist() == [0, 0, 1]
    assert f["byte_offset"].tolist() == [0, 1, 3]
    assert f["bytes"].tolist() == [b"\xc3", b"\xa9\xe4", b"\xb8\x96"]
    assert f["token"].tolist() == ["bytes:\\xc3", "bytes:\\xa9\\xe4", "bytes:\\xb8\\x96"]


def test_invalid_utf8_does_not_fail() -> None:
    f = logprobs_frame(response(message([[logprob(b"a\xff", -0.1), logprob(b"b", -0.1)]])))
    assert "".join(f["text"]) == "a\ufffdb"
    assert f["char_offset"].tolist() == [0, 2]


def test_offsets_restart_per_part_and_keys_identify_rows() -> None:
    r = response(
        message([[logprob("ab", -0.1), logprob("c", -0.2)], [logprob("d", -0.3)]], "msg_a"),
        tool_call(),
        message([[logprob("e", -0.4)]], "msg_b"),
    )
    f = logprobs_frame(r)
    assert f[["output_index", "content_index", "position", "char_offset"]].values.tolist() == [
        [0, 0, 0, 0],
        [0, 0, 1, 2],
        [0, 1, 0, 0],
        [2, 0, 0, 0],
    ]
    assert f["item_id"].tolist() == ["msg_a", "msg_a", "msg_a", "msg_b"]
    assert f["response_id"].tolist() == ["resp_1"] * 4


def test_missing_logprobs_warns_and_keeps_the_schema() -> None:
    r = response(message([None]), tool_call())
    with pytest.warns(UserWarning, match=r'include=\["message.output_text.logprobs"\]'):
        frame = logprobs_frame(r)
    assert frame.empty and _dtypes(frame) == LOGPROBS_COLUMNS
    with pytest.warns(UserWarning, match="top_logprobs"):
        top = top_logprobs_frame([])
    assert top.empty and _dtypes(top) == TOP_LOGPROBS_COLUMNS


def test_objects_dicts_and_mixtures_agree() -> None:
    r1 = _three_alternatives()
    r2 = response(message([[logprob("z", -1.0)]]), rid="resp_2")
    as_objects = logprobs_frame([r1, r2])
    as_dicts = logprobs_frame([r1.model_dump(), r2.model_dump(mode="json")])
    pd.testing.assert_frame_equal(as_objects, as_dicts)
    mixed = logprobs_frame([r1, [e.model_dump() for e in stream(r2)], "junk", 42, {"x": 1}])
    pd.testing.assert_frame_equal(mixed, as_objects)
    assert mixed["response_id"].tolist() == ["resp_1"] * 3 + ["resp_2"]


def test_unknown_items_and_content_are_skipped() -> None:
    data = response(message([[logprob("ok", -0.1)]])).model_dump(mode="json")
    data["output"].insert(0, {"type": "future_item", "id": "x_1", "whatever": [1, 2]})
    data["output"][1]["content"].insert(0, {"type": "future_part", "logprobs": [{"a": 1}]})
    f = logprobs_frame(data)
    assert f[["output_index", "content_index", "token"]].values.tolist() == [[1, 1, "ok"]]


@pytest.mark.parametrize(
    ("per_delta", "done", "completed"),
    [(1, True, True), (1, False, False), (2, False, False), (3, True, False)],
)
def test_stream_equals_folded_response(per_delta: int, done: bool, completed: bool) -> None:
    final = response(
        message(
            [
                [
                    logprob("é".encode()[:1], -0.1, [("x", -0.5)]),
                    logprob("é".encode()[1:], -0.2),
                    logprob(" ok", -0.3, [(" ok", -0.3), (" no", -2.0)]),
                ],
                [logprob("!", -0.01)],
            ]
        ),
        tool_call(),
    )
    events = stream(final, per_delta=per_delta, done=done, completed=completed)
    expected = logprobs_frame(final)
    pd.testing.assert_frame_equal(logprobs_frame(events), expected)
    pd.testing.assert_frame_equal(logprobs_frame([e.model_dump() for e in events]), expected)
    pd.testing.assert_frame_equal(top_logprobs_frame(events), top_logprobs_frame(final))


def test_stream_tokens_are_not_counted_twice() -> None:
    final = response(message([[logprob("a", -0.1), logprob("b", -0.2)]]))
    assert len(logprobs_frame(stream(final, done=True, completed=True))) == 2


def test_concatenated_streams_split_by_sequence_restart() -> None:
    first = response(message([[logprob("a", -0.1)]]), rid="resp_a")
    second = response(message([[logprob("b", -0.2)]]), rid="resp_b")
    events = stream(first, completed=False) + stream(second, completed=False)
    events = [e.model_dump() for e in events]
    for event in events:  # no response.created: only the sequence restart separates them
        if event["type"] == "response.created":
            event["type"] = "response.in_progress"
    frame = logprobs_frame(events)
    assert frame["response_id"].tolist() == ["resp_a", "resp_b"]


def test_no_warning_when_logprobs_exist() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        logprobs_frame(_three_alternatives())


def test_null_alternatives_read_as_none_returned() -> None:
    data = response(message([[logprob("a", -0.1, [("a", -0.1)]), logprob("b", -0.2)]]))
    data = data.model_dump(mode="json")
    data["output"][0]["content"][0]["logprobs"][1]["top_logprobs"] = None
    frame = logprobs_frame(data)
    assert frame["n_top"].tolist() == [1, 0] and frame["rank"].tolist() == [1, pd.NA]
    assert top_logprobs_frame(data)["position"].tolist() == [0]


def test_entries_mixing_dicts_and_objects() -> None:
    final = response(
        message([[logprob("a", -0.1, [("a", -0.1), ("b", -2.0)]), logprob("c", -0.2)]])
    )
    data = final.model_dump()
    data["output"][0]["content"][0]["logprobs"][1] = final.output[0].content[0].logprobs[1]
    pd.testing.assert_frame_equal(logprobs_frame(data), logprobs_frame(final))
    events = stream(final, done=False, completed=False)
    mixed = [e.model_dump() if i % 2 else e for i, e in enumerate(events)]
    pd.testing.assert_frame_equal(logprobs_frame(mixed), logprobs_frame(final))
