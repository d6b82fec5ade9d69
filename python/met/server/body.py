"""The base of every route's request body (OpenAI, Anthropic Messages, Responses) and the one
parser they all go through, so a check made here holds for every route, present and future."""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from met.server.errors import from_validation_error

_INT64 = 2**63


class Body(BaseModel):
    # Strict: "5" is not an int and 1 is not a bool; NaN/Infinity are not numbers.
    # Unknown fields are ignored as the APIs met imitates do (cache_control, ...).
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    @field_validator("*")
    @classmethod
    def _fits_int64(cls, value: Any) -> Any:
        # JSON integers are unbounded; OpenAI, Anthropic and vLLM refuse one past int64 rather
        # than clamp it. Checked on every field of every body, whatever its declared type, so a
        # new integer field cannot be left without it.
        bad = _past_int64(value, ())
        if bad is not None:
            where, number = bad
            error = PydanticCustomError("int64", "must fit in a signed 64-bit integer")
            line: InitErrorDetails = {"type": error, "loc": where, "input": number}
            # A ValidationError raised here keeps the item's place (tokens[3]) in the location.
            raise ValidationError.from_exception_data("int64", [line])
        return value


def _past_int64(value: Any, where: tuple[int, ...]) -> tuple[tuple[int, ...], int] | None:
    """The place and value of the first integer past int64 in a field's value or its lists.
    Nested bodies check their own fields; objects (a JSON schema, a tool's input, metadata) are
    free-form JSON that is passed on, not a number met uses."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return None if -_INT64 <= value < _INT64 else (where, value)
    if isinstance(value, list):
        for i, item in enumerate(value):
            bad = _past_int64(item, (*where, i))
            if bad is not None:
                return bad
    return None


BodyT = TypeVar("BodyT", bound=Body)


def parse_body(raw: bytes, model: type[BodyT]) -> BodyT:
    """The request body as `model`; a bad one is a 400 naming the field (OpenAI-shaped; the
    Anthropic routes reshape it)."""
    try:
        return model.model_validate_json(raw or b"")
    except ValidationError as e:
        raise from_validation_error(e) from None
