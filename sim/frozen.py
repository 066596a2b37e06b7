"""The base of every scenario model: frozen, unknown keys forbidden, field docs in the schema."""

from __future__ import annotations

import typing

from pydantic import BaseModel, ConfigDict, model_validator


def _admits_bool(annotation) -> bool:
    if annotation is bool:
        return True
    return any(_admits_bool(arg) for arg in typing.get_args(annotation))


class FrozenModel(BaseModel):
    """Frozen, `extra="forbid"`, and no bool where a number is expected (`true` is not 1)."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, data):
        if not isinstance(data, dict):
            return data
        for name, value in data.items():
            field = cls.model_fields.get(name)
            if isinstance(value, bool) and field is not None and not _admits_bool(field.annotation):
                raise ValueError(f"{name}: expected a number, got the boolean {value}")
        return data
