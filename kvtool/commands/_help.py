"""Plain-text help for every command: real placeholders, option panels, examples last.

typer's plain help (kvtool runs without rich markup, so a help text may hold ``[...]``)
prints a type after each name (``FILE <list[Path]>``, ``--by <str>``) and ignores
``rich_help_panel``. :class:`KvtoolCommand` shows placeholders instead (``FILE...``,
``DURATION``, ``N``), groups options under their panel's heading (Input, Filters,
Output, ...) and keeps click's width of at most 80 columns. The examples come from the
command's epilog (:func:`kvtool.commands.examples`).
"""

from __future__ import annotations

import re
from typing import Any

from typer.core import TyperArgument, TyperCommand, TyperGroup, TyperOption

try:  # typer >= 0.22 vendors its own click
    from typer import _click as click
except ImportError:  # pragma: no cover - older typer uses click itself
    import click  # type: ignore[no-redef,unused-ignore]

from kvtool.commands._coerce import install

# typer's type labels → placeholders a user can read.
_PLACEHOLDERS = {
    "path": "FILE",
    "str": "TEXT",
    "text": "TEXT",
    "int": "N",
    "int range": "N",
    "float": "X",
    "float range": "X",
    "bool": "",
}
_TYPE_LABEL = re.compile(r" <([^<>]*)>")
_LIST = re.compile(r"^list\[(.*)\]$")


def _placeholder(match: re.Match[str]) -> str:
    label = match.group(1)
    inner = _LIST.match(label)
    if inner is not None:
        label = inner.group(1)
    if "|" in label:
        return f" [{label}]"
    word = _PLACEHOLDERS.get(label.lower(), label.upper())
    return f" {word}" if word else ""


def readable(name: str) -> str:
    """Replace typer's ``<type>`` labels in a help name column with placeholders.

    Args:
        name: E.g. ``--by <str>`` or ``-f, --format <table|json>``.

    Returns:
        E.g. ``--by TEXT`` or ``-f, --format [table|json]``.
    """
    return _TYPE_LABEL.sub(_placeholder, name)


def _argument_name(param: TyperArgument) -> str:
    name = param.metavar or (param.name or "ARG").upper()
    if param.nargs != 1 and "..." not in name:
        name += "..."
    return name


# Old option names kept working but not shown: an option's name here is left out of its
# help line when the option has another long name (``--replay-endpoint, --replay``).
# ``--group`` is no alias any more: it is replay's group filter, and only that (issue 24).
HIDDEN_ALIASES = frozenset({"--out", "--replay"})


def _drop_aliases(param: click.Parameter) -> list[str]:
    opts = list(getattr(param, "opts", []))
    longs = [o for o in opts if o.startswith("--")]
    if len([o for o in longs if o not in HIDDEN_ALIASES]) >= 1:
        opts = [o for o in opts if o not in HIDDEN_ALIASES]
    return opts


class KvtoolCommand(TyperCommand):
    """A typer command whose help reads well as plain text in 80 columns.

    Attributes:
        panels: Per command name, panel title → option names (``--since``), for options
            declared without ``rich_help_panel``; set by :func:`kvtool.cli` from each
            command module's ``HELP_PANELS``. Options in no panel come last.
    """

    panels: dict[str, dict[str, list[str]]] = {}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Plain option values skip typer's pydantic adapters (~0.1 s of every run).
        install(self.params)

    def get_help_option(self, ctx: click.Context) -> TyperOption | None:
        """Click's ``-h/--help``, converted without pydantic too (it is processed every run).

        Args:
            ctx: The click context.

        Returns:
            The help option, or None.
        """
        option = super().get_help_option(ctx)
        install([option] if option is not None else [])
        return option

    def collect_usage_pieces(self, ctx: click.Context) -> list[str]:
        """Usage with the arguments' placeholders (``FILE...``), not ``{files}...``.

        Args:
            ctx: The click context.

        Returns:
            The pieces after the command name.
        """
        pieces = [self.options_metavar] if self.options_metavar else []
        for param in self.get_params(ctx):
            if isinstance(param, TyperArgument) and not param.hidden:
                name = _argument_name(param)
                pieces.append(name if param.required else f"[{name}]")
        return pieces

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """Arguments first, then options under their panel headings, ungrouped last.

        Args:
            ctx: The click context.
            formatter: Where the help goes.
        """
        args: list[tuple[str, str]] = []
        by_name = {
            opt: title
            for title, opts in self.panels.get(self.name or "", {}).items()
            for opt in opts
        }
        # Panels in the order the command module lists them.
        panels: dict[str, list[tuple[str, str]]] = {
            title: [] for title in self.panels.get(self.name or "", {})
        }
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            name, text = record
            if isinstance(param, TyperArgument):
                name = _argument_name(param)
                text = text.replace("  [required]", "").replace("[required]", "")
                args.append((name, text.strip()))
                continue
            shown = _drop_aliases(param)
            if shown != list(getattr(param, "opts", [])):
                saved = param.opts
                param.opts = shown
                try:
                    record = param.get_help_record(ctx)
                finally:
                    param.opts = saved
                name, text = record if record is not None else (name, text)
            panel = getattr(param, "rich_help_panel", None) or next(
                (by_name[o] for o in getattr(param, "opts", []) if o in by_name), "Other options"
            )
            panels.setdefault(panel, []).append((readable(name), text))
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        other = panels.pop("Other options", [])
        order = {opt: i for i, opt in enumerate(by_name)}

        def listed(row: tuple[str, str]) -> int:
            # A row's place in its panel's list (by its first listed option name).
            names = re.findall(r"--?[\w-]+", row[0].split(" [")[0])
            return min((order[n] for n in names if n in order), default=len(order))

        panels = {title: sorted(rows, key=listed) for title, rows in panels.items() if rows}
        for title, rows in panels.items():
            with formatter.section(title):
                formatter.write_dl(rows)
        if other:
            with formatter.section("Options" if not panels else "Other options"):
                formatter.write_dl(other)


class KvtoolGroup(TyperGroup):
    """typer's group (``kvtool`` itself), whose options are converted without pydantic."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        install(self.params)

    def get_help_option(self, ctx: click.Context) -> TyperOption | None:
        """Click's ``-h/--help`` of ``kvtool``, converted without pydantic.

        Args:
            ctx: The click context.

        Returns:
            The help option, or None.
        """
        option = super().get_help_option(ctx)
        install([option] if option is not None else [])
        return option


__all__ = ["HIDDEN_ALIASES", "KvtoolCommand", "KvtoolGroup", "readable"]
