"""Checks every route's body gets before anything is queued, without a model: integers within
int64 on every route (one validator on the shared base)."""

from __future__ import annotations

import importlib
import json
import pkgutil

import pytest
from pydantic import BaseModel

import met.server
from met.server.body import Body, parse_body
from met.server.errors import APIError
from met.server.messages.protocol import CountTokensBody, MessagesBody
from met.server.protocol import ChatCompletionBody, CompletionBody, DetokenizeBody
from met.server.responses.protocol import ResponsesBody

BIG = 2**63
USER = {"role": "user", "content": "hi"}


# (body model, body, the param the 400 names): an integer field of each route, at every depth.
PAST_INT64 = [
    (CompletionBody, {"prompt": "x", "best_of": BIG}, "best_of"),
    (CompletionBody, {"prompt": [[1], [2, -BIG - 1]]}, "prompt[1][1]"),
    (ChatCompletionBody, {"messages": [USER], "max_thinking_tokens": BIG}, "max_thinking_tokens"),
    (ChatCompletionBody, {"messages": [USER], "top_logprobs": BIG}, "top_logprobs"),
    (MessagesBody, {"max_tokens": BIG, "messages": [USER]}, "max_tokens"),
    (MessagesBody, {"max_tokens": 8, "top_k": BIG, "messages": [USER]}, "top_k"),
    (
        MessagesBody,
        {
            "max_tokens": 8,
            "messages": [USER],
            "thinking": {"type": "enabled", "budget_tokens": BIG},
        },
        "thinking.budget_tokens",
    ),
    (
        CountTokensBody,
        {"messages": [USER], "thinking": {"type": "enabled", "budget_tokens": BIG}},
        "thinking.budget_tokens",
    ),
    (ResponsesBody, {"input": "x", "max_output_tokens": BIG}, "max_output_tokens"),
    (DetokenizeBody, {"tokens": [1, BIG]}, "tokens[1]"),
]


@pytest.mark.parametrize(("model", "body", "param"), PAST_INT64)
def test_every_route_refuses_an_integer_past_int64(
    model: type[Body], body: dict, param: str
) -> None:
    with pytest.raises(APIError) as e:
        parse_body(json.dumps(body).encode(), model)
    assert (e.value.status, e.value.param) == (400, param)
    assert e.value.message == f"{param}: must fit in a signed 64-bit integer"


def test_int64_bounds_hold_and_free_form_json_passes() -> None:
    body = parse_body(
        json.dumps(
            {
                "max_tokens": BIG - 1,
                "top_k": -BIG,
                "messages": [{"role": "user", "content": "x"}],
                # A tool's schema and metadata are JSON passed on, not numbers met uses.
                "tools": [{"name": "t", "input_schema": {"type": "integer", "maximum": 2**70}}],
                "metadata": {"n": 2**70},
            }
        ).encode(),
        MessagesBody,
    )
    assert (body.max_tokens, body.top_k) == (BIG - 1, -BIG)


def test_every_request_body_of_the_server_is_a_body() -> None:
    # The int64 check lives on Body, so a request model that is not one would skip it.
    for info in pkgutil.walk_packages(met.server.__path__, "met.server."):
        importlib.import_module(info.name)
    models = _subclasses(BaseModel)
    served = [m for m in models if m.__module__.startswith("met.server.")]
    assert len(served) > 20
    assert [m for m in served if not issubclass(m, Body)] == []


def _subclasses(cls: type) -> set[type]:
    out = set(cls.__subclasses__())
    for sub in list(out):
        out |= _subclasses(sub)
    return out
