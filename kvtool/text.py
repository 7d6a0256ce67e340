"""Strings from files and the network made safe for a terminal, a CSV cell or one log line.

Every string kvtool did not write itself (an endpoint, a topic, a kind, channel metadata, an
error text quoting a peer) passes through :func:`printable` before it reaches a terminal, so an
escape sequence in a recording or from a publisher cannot move the cursor, retitle the window or
hide text. Markdown output passes them through :func:`markdown` (printable, and no markup or
HTML of the input's own); CSV output (report and export) passes its text cells through
:func:`csv_text` (printable, then :func:`csv_safe`) so a spreadsheet does not run a cell that
starts like a formula.
"""

from __future__ import annotations

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\x1b": "\\x1b"}
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def _escape(ch: str) -> str:
    named = _NAMED.get(ch)
    if named is not None:
        return named
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(value: object) -> str:
    r"""Return ``str(value)`` with every character a reader cannot see escaped.

    The one rule, for every terminal, Markdown and CSV sink: a character Python's
    :meth:`str.isprintable` rejects -- Unicode's "Other" and "Separator" categories except
    the ASCII space: C0/C1 controls, every format character (bidi controls such as U+061C
    and U+202E, soft hyphen, zero-width characters, U+206A-206F, the TAG block), line and
    paragraph separators (U+2028/2029), spaces other than U+0020, private-use and
    unassigned code points -- comes back as a visible escape (````, ``​``,
    ``󠁁``). Two strings that differ in such a character never print alike (issue
    24: ``full_attention`` and ``full_attention`` + a TAG character were two identical rows).

    Args:
        value: Anything; ``None`` becomes ``""``.

    Returns:
        A string with no character that a terminal would act on or hide: an ESC byte comes
        back as the four visible characters ````.
    """
    if value is None:
        return ""
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else _escape(ch) for ch in text)


_MD_ALWAYS = {
    "\\": "\\\\",
    "`": "\\`",
    "*": "\\*",
    "[": "\\[",
    "]": "\\]",
    "|": "\\|",
    "~": "\\~",
    "<": "&lt;",
    "&": "&amp;",
}


def markdown(value: object) -> str:
    r"""Return :func:`printable` text escaped for a Markdown paragraph or table cell.

    A kind name, path or finding from a file is text in kvtool's Markdown, never markup:
    ``\ ` * [ ] | ~`` are backslash-escaped, ``<`` and ``&`` become entities (no HTML tag,
    no entity of the input's own), and an ``_`` is escaped unless it sits between two letters
    or digits (``full_attention`` stays readable: CommonMark never emphasises inside a
    word).

    Args:
        value: Anything; ``None`` becomes ``""``.

    Returns:
        The escaped text, on one line.
    """
    text = printable(value)
    out: list[str] = []
    n = len(text)
    for i, ch in enumerate(text):
        esc = _MD_ALWAYS.get(ch)
        if esc is not None:
            out.append(esc)
        elif ch == "_" and not (0 < i < n - 1 and text[i - 1].isalnum() and text[i + 1].isalnum()):
            out.append("\\_")
        else:
            out.append(ch)
    return "".join(out)


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


def csv_text(value: str) -> str:
    """Return a CSV text cell from a file or the network: :func:`printable`, then :func:`csv_safe`.

    Args:
        value: The cell's text.

    Returns:
        The text every CSV kvtool writes (report and export) holds.
    """
    return csv_safe(printable(value))


__all__ = ["csv_safe", "csv_text", "markdown", "printable"]


def plural(n: int, word: str, many: str | None = None) -> str:
    """Return ``"1 batch"`` / ``"2 batches"``: the count and the right form of ``word``.

    Args:
        n: The count.
        word: The singular.
        many: The plural, when it is not ``word + "s"`` (``word + "es"`` after s, x, ch, sh).

    Returns:
        The count and the noun, thousands separated.
    """
    if n == 1:
        return f"1 {word}"
    if many is None:
        many = word + ("es" if word.endswith(("s", "x", "ch", "sh")) else "s")
    return f"{n:,} {many}"
