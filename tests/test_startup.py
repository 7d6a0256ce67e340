"""Start-up of the console script (issue 10): what each run imports, and typer's conversions.

No timings here: the tests check which libraries a run imports (a run that imports
pydantic, rich, pyzmq or the mcap writer pays for them whether it uses them or not) and
that kvtool's plain option conversion answers exactly as typer's pydantic adapters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer.main

from kvtool.cli import app

RECORDINGS = Path(__file__).parent.parent / "recordings"
FULL = RECORDINGS / "full_only.mcap"

# Runs the console script's main() and writes the modules it imported to a file at exit.
_PROBE = """
import atexit, json, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
from kvtool.cli import main
sys.argv[0] = "kvtool"
main()
"""

NEVER_AT_START = ("pydantic", "typer._adapters", "zmq", "mcap", "matplotlib", "pyarrow", "ray")


def _imports(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    where = tmp_path / "modules.json"
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, str(where), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return proc, set(json.loads(where.read_text()))


def _loaded(modules: set[str], *roots: str) -> list[str]:
    return sorted(m for m in modules if m in roots or m.startswith(tuple(f"{r}." for r in roots)))


@pytest.mark.parametrize("quiet", [["-q"], []])
def test_issue10_startup_report_json_imports_only_what_it_needs(
    tmp_path: Path, quiet: list[str]
) -> None:
    # Without -q too: stderr is not a terminal (no progress bar) and there is no finding.
    proc, modules = _imports(tmp_path, "report", str(FULL), "--format", "json", *quiet)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert json.loads(proc.stdout)["by_kind"]
    assert _loaded(modules, *NEVER_AT_START, "rich") == []
    assert _loaded(modules, "kvtool.recording.writer", "kvtool.capture", "kvtool.info") == []
    # Only the command that runs is imported.
    others = ("replay", "info", "diff", "export", "record", "top")
    assert _loaded(modules, *(f"kvtool.commands.{c}" for c in others)) == []


def test_issue10_startup_cli_module_imports_no_typer() -> None:
    # Each worker process of `report --jobs` re-imports the console script, which imports
    # kvtool.cli: typer and the app are built by main(), not at import.
    code = "import sys, kvtool.cli; print(sorted(m for m in sys.modules if m.startswith('typer')))"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.stdout == "[]\n", proc.stderr


def test_issue10_startup_version_imports_no_library(tmp_path: Path) -> None:
    proc, modules = _imports(tmp_path, "--version")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("kvtool ")
    heavy = ("polars", "numpy", "msgspec", "rich", "kvtool.commands.report", "kvtool.protocol")
    assert _loaded(modules, *NEVER_AT_START, *heavy) == []


def test_issue10_startup_report_help_and_usage_errors_skip_polars(tmp_path: Path) -> None:
    proc, modules = _imports(tmp_path, "report", "--help")
    assert proc.returncode == 0, proc.stderr
    assert "--format" in proc.stdout
    assert _loaded(modules, *NEVER_AT_START, "polars", "numpy") == []
    proc, modules = _imports(tmp_path, "report", str(FULL), "--jobs", "0")
    assert proc.returncode == 2
    assert "greater than or equal to 1" in proc.stderr  # typer's words, from its adapter
    assert _loaded(modules, "polars", "numpy") == []


@pytest.mark.parametrize("args", [["--help"], ["diff", "--help"]])
def test_issue10_startup_root_and_diff_help_skip_polars(args: list[str], tmp_path: Path) -> None:
    # diff's help quotes kvtool.diff's --fail-on syntax; kvtool.diff takes the report's
    # column names from kvtool.report.names, which needs no polars (the package loads its
    # library lazily).
    proc, modules = _imports(tmp_path, *args)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: kvtool")
    assert _loaded(modules, "polars", "numpy") == []


@pytest.mark.parametrize("name", ["report", "replay", "info", "export", "record", "top"])
def test_issue10_startup_command_help_imports_no_library(name: str, tmp_path: Path) -> None:
    proc, modules = _imports(tmp_path, name, "--help")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("Usage: kvtool ")
    libraries = ("polars", "numpy", "msgspec", "rich")
    assert _loaded(modules, *NEVER_AT_START, *libraries) == []


# Values a user may type: plain ones kvtool converts, and ones it hands to typer.
_SAMPLES: list[Any] = [
    "5",
    "007",
    "0",
    "-1",
    "+5",
    " 2",
    "1_0",
    "3.5",
    "0.25",
    ".5",
    "inf",
    "nan",
    "abc",
    "",
    "json",
    "JSON",
    "publish",
    "kind,window",
    "run.mcap",
    "-",
    "a\udcffb",
    5,
    2.5,
    True,
    False,
]


def _outcome(runtime: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        out = runtime.coerce(value, param=param, ctx=ctx)
    except Exception as err:  # the error itself is what is compared
        return "error", (type(err).__name__, str(err))
    return "value", (type(out).__name__, out)


def test_issue10_plain_conversion_answers_as_typer_for_every_option() -> None:
    from typer._coercion import build_runtime_param

    from kvtool.commands._coerce import PlainParam

    group = typer.main.get_command(app)
    checked = 0
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        ctx = cmd.make_context(name, ["--help"], resilient_parsing=True)
        for param in cmd.params:
            plain = getattr(param, "_runtime_param", None)
            if not isinstance(plain, PlainParam):
                continue
            reference = build_runtime_param(param.type_descriptor)
            many = param.multiple or param.nargs == -1
            values = [(v,) if many and not isinstance(v, str) else v for v in _SAMPLES]
            if many:
                values += [("a", "b"), ("5", "x.mcap"), ()]
            for value in values:
                want = _outcome(reference, value, param, ctx)
                got = _outcome(plain, value, param, ctx)
                assert got == want, (name, param.name, value)
                checked += 1
    assert checked > 500


@pytest.mark.parametrize(
    "args",
    [
        ["report", str(FULL), "--jobs", "abc"],
        ["report", str(FULL), "--format", "JSON"],
        ["report", str(FULL), "--clock", "nope"],
    ],
)
def test_issue10_bad_values_keep_typers_message(args: list[str], tmp_path: Path) -> None:
    proc, modules = _imports(tmp_path, *args)
    assert proc.returncode == 2
    assert proc.stderr.startswith("kvtool report: Invalid value for '")
    assert "typer._adapters" in modules  # the fallback: typer words the error


def test_issue10_lazy_package_exports_every_name() -> None:
    # Submodules imported first (as the report path does) do not hide the exports.
    code = (
        "import types, kvtool.annotate, kvtool.recording.writer, kvtool\n"
        "assert not isinstance(kvtool.annotate, types.ModuleType), kvtool.annotate\n"
        "from kvtool import annotate\n"
        "assert callable(annotate)\n"
        "missing = [n for n in kvtool.__all__ if not hasattr(kvtool, n)]\n"
        "assert missing == [], missing\n"
        "assert set(kvtool.__all__) <= set(dir(kvtool))\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.stdout == "ok\n", proc.stderr
