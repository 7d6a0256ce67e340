"""Strings from files and the network made safe for a terminal, a CSV cell or one log line.

Every string kvtool did not write itself (an endpoint, a topic, a kind, channel metadata, an
error text quoting a peer) passes through :func:`printable` before it reaches a terminal, so an
escape sequence in a recording or from a publisher cannot move the cursor, retitle the window or
hide text. CSV output passes its text cells through :func:`csv_safe` so a spreadsheet does not
run a cell that starts like a formula.
"""

from __future__ import annotations

import re

# C0 and C1 controls, DEL, and the Unicode format/bidi controls that reorder what a person reads
# (Trojan Source, CVE-2021-42574). Tab is escaped too: it breaks column layouts.
_UNPRINTABLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _escape(match: re.Match[str]) -> str:
    ch = match.group(0)
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: object) -> str:
    r"""Return ``str(value)`` with every control and bidi-format character escaped.

    Args:
        value: Anything; ``None`` becomes ``""``.

    Returns:
        A string with no character that a terminal would act on: an ESC byte comes back as the
        four visible characters ``\x1b``.
    """
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return _UNPRINTABLE.sub(_escape, text)


def csv_safe(value: str) -> str:
    """Return a CSV text cell that spreadsheets show as text, never evaluate as a formula.

    A cell starting with ``= + - @``, tab or carriage return gets a leading apostrophe (the
    OWASP rule for CSV injection). Numbers are not text cells and are never passed here.

    Args:
        value: The cell's text.

    Returns:
        The text, prefixed with ``'`` when it would start a formula.
    """
    if value and value.startswith(_FORMULA_START):
        return "'" + value
    return value


__all__ = ["csv_safe", "printable"]
