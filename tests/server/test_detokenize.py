"""``/detokenize`` refuses ids outside the vocabulary with a 400 naming ``tokens``, as
``/v1/completions`` refuses them in a prompt, instead of answering ``""``."""

from __future__ import annotations

import pytest
from helpers.server import ThreadedServer, scripted

pytestmark = pytest.mark.timeout(120)


def error_of(response, status: int) -> dict:
    assert response.status_code == status, response.text
    return response.json()["error"]


def test_ids_outside_the_vocabulary_are_a_400(tokenizer):
    client, _ = scripted(tokenizer, "unused")
    size = len(tokenizer)
    with ThreadedServer(client) as server, server.http() as http:
        ok = http.post("/detokenize", json={"tokens": [size - 1]})
        assert ok.status_code == 200
        for tokens in ([size], [1, 10**7]):
            err = error_of(http.post("/detokenize", json={"tokens": tokens}), 400)
            assert err["param"] == "tokens" and f"[0, {size})" in err["message"], err
        assert http.post("/detokenize", json={"tokens": []}).json() == {"prompt": ""}


def test_the_same_400_as_completions(fused_engine):
    outside = [1, 10**7]
    with ThreadedServer(fused_engine.client()) as server, server.http() as http:
        completion = error_of(
            http.post("/v1/completions", json={"prompt": outside, "max_tokens": 1}), 400
        )
        detokenize = error_of(http.post("/detokenize", json={"tokens": outside}), 400)
    assert completion["message"].split(": ", 1)[1] == detokenize["message"].split(": ", 1)[1]
    assert (completion["param"], detokenize["param"]) == ("prompt", "tokens")
