"""Option values converted without pydantic when the answer is plain (start-up time).

typer (0.2x) converts every option value of the running command through a pydantic
``TypeAdapter`` built for it at parse time: importing pydantic and building ~20 adapters
costs ~0.1 s of every ``kvtool`` run, more than reading a small recording. kvtool's
options are of a few plain types (``bool``, ``str``, ``Path``, ``int``/``float`` with a minimum,
a ``StrEnum``, lists of those), whose valid values :class:`PlainParam` converts itself,
exactly as the adapter would. Anything else -- a value that needs pydantic's leniency
(``+5``, ``1_000``), a bad value (whose message must stay typer's), another type --
goes to typer's own adapter, built then. :func:`install` is a no-op on a typer that
works otherwise (older ones use click types, no pydantic).
"""

from __future__ import annotations

import re
from enum import Enum
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, get_args, get_origin

try:
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
    from typer._param_types import coerce_cli_choice, coerce_cli_path
    from typer.core import _TyperParameter
except ImportError:  # pragma: no cover - a typer without pydantic adapters
    _AVAILABLE = False
else:
    _AVAILABLE = True

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    try:
        from typer import _click as click
    except ImportError:  # pragma: no cover
        import click  # type: ignore[no-redef,unused-ignore]

_INT = re.compile(r"[0-9]{1,18}")
_FLOAT = re.compile(r"[0-9]{1,15}(?:\.[0-9]{0,15})?")


class _Fallback(Exception):
    """The value is not plain: typer's adapter converts it (or words its error)."""


def _in_range(number: float, low: float | None, high: float | None) -> bool:
    return (low is None or number >= low) and (high is None or number <= high)


def _leaf(annotation: Any, descriptor: TypeDescriptor) -> Callable[[Any, Any, Any], Any] | None:
    """The plain converter of one (non-list) annotation, or None to leave it to typer."""
    info = descriptor.parameter_info
    if info.parser is not None or getattr(info, "click_type", None) is not None:
        return None
    if annotation is bool:

        def to_bool(value: Any, param: Any, ctx: Any) -> Any:
            if type(value) is bool:
                return value
            raise _Fallback

        return to_bool
    if annotation is str:

        def to_str(value: Any, param: Any, ctx: Any) -> Any:
            if type(value) is str:
                return value
            raise _Fallback

        return to_str
    if annotation is Path:
        if info.resolve_path or info.path_type is not None or info.allow_dash:
            return None

        def to_path(value: Any, param: Any, ctx: Any) -> Any:
            if type(value) is not str:
                raise _Fallback
            # typer's checks (exists=, dir_okay=, ...) on the text as typed (it returns the
            # text), then the Path pydantic would make of it: Path(text), for every str.
            coerce_cli_path(value, info, path_type=None, param=param, ctx=ctx)
            return Path(value)

        return to_path
    if annotation is int or annotation is float:
        if getattr(info, "clamp", False):
            return None
        pattern = _INT if annotation is int else _FLOAT

        def to_number(value: Any, param: Any, ctx: Any) -> Any:
            if type(value) is str and pattern.fullmatch(value):
                number = annotation(value)
            elif type(value) is annotation:
                number = value
            else:
                raise _Fallback
            if not _in_range(number, info.min, info.max):
                raise _Fallback
            return number

        return to_number
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        choices = tuple(annotation)

        def to_choice(value: Any, param: Any, ctx: Any) -> Any:
            try:
                return coerce_cli_choice(
                    value, choices=choices, case_sensitive=info.case_sensitive, ctx=ctx
                )
            except ValueError:
                raise _Fallback from None

        return to_choice
    return None


if _AVAILABLE:
    from dataclasses import dataclass

    @dataclass(frozen=True)
    class PlainParam(RuntimeParam):
        """typer's runtime conversion of one parameter, plain values converted here.

        Attributes:
            descriptor: typer's description of the parameter's type.
            convert: The plain converter.
            many: The parameter is a ``list[...]``.
        """

        descriptor: TypeDescriptor
        convert: Callable[[Any, Any, Any], Any]
        many: bool

        @cached_property
        def typer_param(self) -> RuntimeParam:
            """Typer's own conversion (a pydantic adapter), built when first needed."""
            return build_runtime_param(self.descriptor)

        def _coerce_value(self, value: Any, param: _TyperParameter, ctx: click.Context) -> Any:
            try:
                if not self.many:
                    return self.convert(value, param, ctx)
                items = value if isinstance(value, (list, tuple)) else [value]
                return [self.convert(item, param, ctx) for item in items]
            except _Fallback:
                return self.typer_param._coerce_value(value, param=param, ctx=ctx)

    def _plain(descriptor: TypeDescriptor) -> PlainParam | None:
        annotation: Any = descriptor.annotation
        if descriptor.file_annotation is not None or descriptor.is_tuple:
            return None
        many = get_origin(annotation) is list
        if many:
            (annotation,) = get_args(annotation)
        elif get_origin(annotation) is not None:
            return None
        convert = _leaf(annotation, descriptor)
        if convert is None:
            return None
        return PlainParam(
            parameter_info=descriptor.parameter_info,
            annotation=descriptor.annotation,
            descriptor=descriptor,
            convert=convert,
            many=many,
        )


def install(params: Iterable[click.Parameter]) -> None:
    """Give each typer parameter of a command the plain conversion, where it has one.

    Args:
        params: The command's parameters (typer's options and arguments).
    """
    if not _AVAILABLE:
        return
    for param in params:
        if getattr(param, "_runtime_param", True) is not None:
            continue  # not typer's, or converted already (or a typer that works otherwise)
        try:
            plain = _plain(param.type_descriptor)  # type: ignore[attr-defined]
        except (AttributeError, TypeError):  # pragma: no cover - another typer's internals
            return
        if plain is not None:
            param._runtime_param = plain  # type: ignore[attr-defined]


__all__ = ["install"]
