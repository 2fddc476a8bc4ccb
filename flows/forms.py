"""What the Prefect UI's run forms show for the flows' parameter models.

- :data:`OptionalInt` / :data:`OptionalFloat`: a number field whose empty value means "the config file's".
  Typed ``int | None`` in Python, but shown as a plain number input: the form drew ``int | None`` as a type
  toggle whose default failed with ``Property is type "None"``. An unset field is left out of the form's
  default and of the submitted parameters (:class:`FormParams`), so it arrives as None.
- :func:`config_value`: the value a field takes from the default config, for the field's help text.
- :func:`plain_description`: the form's description of a model, instead of its (RST) docstring.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Annotated, Any

from pydantic import BaseModel, WithJsonSchema, model_serializer


class _EmptyIsConfig:
    """Marker (in a field's ``Annotated`` metadata): None means the config's value, and is not serialised."""


def _number(kind: str) -> Any:
    return WithJsonSchema({"type": kind})


OptionalInt = Annotated[int | None, _number("integer"), _EmptyIsConfig()]
OptionalFloat = Annotated[float | None, _number("number"), _EmptyIsConfig()]


def no_default(schema: dict[str, Any]) -> None:
    """``json_schema_extra`` of an optional number: no ``"default": null`` for the form to reject."""
    schema.pop("default", None)


def plain_description(text: str):
    """``json_schema_extra`` of a parameter model: ``text`` as the form's description (not the docstring)."""
    def extra(schema: dict[str, Any]) -> None:
        schema["description"] = text

    return extra


class FormParams(BaseModel):
    """Base of the flows' parameter models: optional numbers left unset are not serialised (so neither the
    form's default nor a submitted run holds a ``null`` the number input cannot show)."""

    @model_serializer(mode="wrap")
    def _drop_unset_numbers(self, handler: Any) -> Any:
        data = handler(self)
        if not isinstance(data, dict):
            return data
        empty = {k for k, f in type(self).model_fields.items()
                 if any(isinstance(m, _EmptyIsConfig) for m in f.metadata) and getattr(self, k) is None}
        return {k: v for k, v in data.items() if k not in empty}


def config_value(path: str, config: str = "configs/cpu-smoke.yaml") -> Any:
    """The value at dotted ``path`` (e.g. ``algo.G``) of ``config`` as loaded (defaults filled in); None when
    the file cannot be read (a form then loses a hint, never its import)."""
    try:
        value: Any = _load(config)
        for part in path.split("."):
            value = getattr(value, part)
        return value
    except Exception:  # noqa: BLE001 - a hint only
        return None


@lru_cache(maxsize=4)
def _load(config: str) -> Any:
    from rao_core.config import load_config
    from rao_core.paths import REPO_ROOT

    return load_config(REPO_ROOT / config)


def empty_means(path: str, config: str = "configs/cpu-smoke.yaml") -> str:
    """Help-text tail of an optional field: ``Empty: the config file's (cpu-smoke: 2).``"""
    v = config_value(path, config)
    short = config.rsplit("/", 1)[-1].removesuffix(".yaml")
    return f"Empty: the config file's ({short}: {'unset' if v is None else v})."
