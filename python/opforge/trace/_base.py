"""The base model of the trace schema and its JSON text form.

* Fields are written in declaration order, which follows the FlashInfer-Trace classes, so
  files opforge writes look like the ones FlashInfer-Bench writes.
* Fields the public format does not know (opforge extensions, listed in a model's
  ``_omit_when_empty``) are left out while empty, so files without them stay unchanged.
* Fields a model does not declare are kept as they were read and written back after the
  declared ones, so files from newer or older writers re-save without losing anything; optional
  fields a file left out (a description, empty constraints) are not added when it is written back.
* ``.json`` files: 2-space indentation, a trailing newline. ``.jsonl`` lines: compact
  (``","`` and ``":"`` separators), one object per line. Non-finite floats are written as the
  strings "NaN", "Infinity", "-Infinity" (as FlashInfer-Bench does), and read back as floats.
  Saving what was loaded from such files gives the same bytes.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, ClassVar, Optional

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_serializer, model_validator

from .errors import SchemaError

# Integers that reach torch (axis sizes, scalar inputs, seeds) must fit its int64: a larger one
# fails deep inside a benchmark ("Overflow when unpacking long long") instead of at validation.
INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
Size = Annotated[int, Field(strict=True, ge=0, le=INT64_MAX)]


def int64_message(value: Any) -> str:
    return f"{_short(value)} does not fit in int64 ({INT64_MIN} to {INT64_MAX})"


class TraceModel(BaseModel):
    """Base of every schema object: validated on construction (SchemaError on failure)."""

    model_config = ConfigDict(extra="allow", ser_json_inf_nan="constants", populate_by_name=True,
                              validate_default=False)

    #: Extension fields dropped from the JSON form while None / empty.
    _omit_when_empty: ClassVar[tuple[str, ...]] = ()
    #: Read from a file (from_dict): optional fields the file left out stay out when written back.
    _from_file: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _remember_source(self, info):
        if info.context and info.context.get("from_file"):
            # Nested models are built through __init__ (overridden here), which drops the
            # validation context: mark them from the top.
            _mark_from_file(self)
        return self

    def __init__(self, /, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise schema_error(exc, data, type(self).__name__) from None

    def __eq__(self, other: Any) -> bool:
        """Equal when of the same class with the same field values."""
        if not isinstance(other, BaseModel):
            return NotImplemented
        return (type(self) is type(other) and self.__dict__ == other.__dict__
                and self.__pydantic_extra__ == other.__pydantic_extra__)

    __hash__ = None  # mutable

    @classmethod
    def from_dict(cls, data: Any):
        """Validate a JSON-shaped dict (as read from a file)."""
        try:
            return cls.model_validate(data, context={"from_file": True})
        except ValidationError as exc:
            raise schema_error(exc, data, cls.__name__) from None

    @classmethod
    def from_json(cls, text: str):
        return cls.from_dict(loads(text))

    @model_serializer(mode="wrap")
    def _serialize(self, handler, info):
        data = handler(self)
        for name in self._omit_when_empty:
            if name in data and data[name] in (None, {}, []):
                del data[name]
        if self._from_file and not (info.context and info.context.get("every_field")):
            # A field the file did not have and that still holds its empty default (e.g. a
            # definition's description or constraints) is not added on the way back.
            for name in type(self).model_fields:
                if name not in self.model_fields_set and name in data and data[name] in (None, {}, []):
                    del data[name]
        return data

    def to_dict(self) -> dict:
        """The JSON form as Python objects (field order preserved)."""
        return self.model_dump(mode="json")

    def hash_form(self) -> dict:
        """The JSON form with every declared field, whether or not the file it came from wrote
        the empty ones: what content hashes are computed from, so they do not depend on it."""
        return self.model_dump(mode="json", context={"every_field": True})

    def to_json(self, indent: Optional[int] = 2) -> str:
        """JSON text: indented with a trailing newline, or one compact line when indent is None."""
        return dumps(self.to_dict(), indent=indent)


def _mark_from_file(value) -> None:
    if isinstance(value, TraceModel):
        value._from_file = True
        for name in type(value).model_fields:
            _mark_from_file(getattr(value, name))
    elif isinstance(value, dict):
        for v in value.values():
            _mark_from_file(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _mark_from_file(v)


# --- JSON text ---------------------------------------------------------------------------


class DuplicateKeyError(ValueError):
    def __init__(self, key: str):
        self.key = key
        super().__init__(f"key {key!r} appears twice in one object")


def _no_duplicates(pairs):
    out = {}
    for key, value in pairs:
        if key in out:
            raise DuplicateKeyError(key)
        out[key] = value
    return out


def loads(text: str) -> Any:
    """Parse JSON text; a key repeated inside one object raises DuplicateKeyError."""
    return json.loads(text, object_pairs_hook=_no_duplicates)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def dumps(data: Any, indent: Optional[int] = 2) -> str:
    """The canonical text of a JSON value: see the module docstring."""
    data = _finite(data)
    if indent is None:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return json.dumps(data, ensure_ascii=False, indent=indent, allow_nan=False) + "\n"


def canonical_hash_text(data: Any) -> str:
    """Key-sorted compact JSON, the input of content hashes."""
    return json.dumps(_finite(data), ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)


# --- pydantic errors -> (field, message) ----------------------------------------------------


def _walk(loc: tuple, data: Any) -> tuple[str, Any]:
    """Turn a pydantic location into a dotted path through the actual data, dropping the
    location parts that name union members or validators rather than keys."""
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int) and isinstance(data, (list, tuple)) and 0 <= item < len(data):
            parts.append(f"[{item}]")
            data = data[item]
            continue
        if isinstance(data, dict) and item in data:
            data = data[item]
        elif isinstance(data, BaseModel) and isinstance(item, str) and hasattr(data, item):
            data = getattr(data, item)
        elif isinstance(data, (dict, BaseModel)) and isinstance(item, str) and not _is_tag(item):
            data = None  # a missing field: still part of the path
        else:
            continue
        parts.append(("." if parts else "") + str(item))
    return "".join(parts), data


def _is_tag(item: str) -> bool:
    return item in ("const", "var", "random", "scalar", "safetensors", "range", "indptr") or "[" in item


def _message(err: dict) -> tuple[str, str]:
    kind = err.get("type", "")
    ctx = err.get("ctx") or {}
    value = err.get("input")
    if kind == "enum":
        expected = str(ctx.get("expected", "")).replace("'", "").replace(" or ", ", ")
        return "", f"{value!r} is not one of {expected}"
    if kind == "missing":
        return "", "required field is missing"
    if kind == "union_tag_invalid":
        return "", (f"{str(ctx.get('discriminator', 'type')).strip(chr(39))} {ctx.get('tag')!r} is not one of "
                      f"{str(ctx.get('expected_tags', '')).replace(chr(39), '')}")
    if kind == "union_tag_not_found":
        return "", f"missing the {str(ctx.get('discriminator', 'type')).strip(chr(39))!r} field"
    if kind == "literal_error":
        return "", f"{value!r} is not {str(ctx.get('expected', '')).replace(chr(39), '')}"
    if kind == "less_than_equal" and ctx.get("le") == INT64_MAX:
        return "", int64_message(value)
    msg = str(err.get("msg", "invalid value"))
    msg = msg.removeprefix("Value error, ")
    if kind.endswith("_type") or kind.endswith("_parsing") or kind in ("greater_than", "greater_than_equal",
                                                                        "too_short", "string_too_short"):
        return "", f"{msg} (got {_short(value)})"
    return "", msg


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(exc: ValidationError, data: Any) -> list[tuple[str, str]]:
    """The (field, message) pairs of a pydantic ValidationError, fields as dotted paths."""
    out: list[tuple[str, str]] = []
    for err in exc.errors(include_url=False):
        path, _ = _walk(tuple(err.get("loc", ())), data)
        inner = (err.get("ctx") or {}).get("error")
        if err.get("type") == "value_error" and isinstance(inner, SchemaError):
            pairs = inner.errors  # raised by a validator or by a nested model's __init__
        else:
            pairs = [_message(err)]
        for inner_field, message in pairs:
            full = ".".join(p for p in (path, inner_field) if p).replace(".[", "[")
            if (full, message) not in out:
                out.append((full, message))
    return out


def schema_error(exc: ValidationError, data: Any, model: str) -> SchemaError:
    errors = describe(exc, data)
    field, message = errors[0] if errors else ("", str(exc))
    return SchemaError(field, message, model=model, errors=errors)
