"""``responses.create`` parameters as ``protocol/request.py`` validates them."""

from __future__ import annotations

from helpers.responses import client_for


async def test_transport_knobs_accepted(tokenizer):
    client, _ = client_for(tokenizer, "ok")
    r = await client.responses.create(
        input="hi",
        model="smollm2",
        extra_headers={"X-A": "1"},
        extra_query={"q": 1},
        timeout=5,
        extra_body={"metadata": {"k": "v"}},
        user="me",
        metadata=None,
    )
    assert r.metadata == {"k": "v"} and r.user == "me" and r.output_text == "ok"
