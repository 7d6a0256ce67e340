"""Issue 21 review: ``--group-meta none=KIND`` survives ``replay -o``, and the findings name it.

- ``replay FILE --annotate --group-meta none=KIND -o COPY`` wrote an empty ``kvtool.groups``
  record: ``info``/``report`` on the copy said DAMAGED (exit 3), and replay warned "no group
  metadata … give --group IDX=KIND". The copy now keeps the rule in a ``kvtool.ungrouped``
  record (``get_kv_cache_group_metadata()``'s list has no entry for it; the payload bytes
  stay as received), so a report of the copy gives the kinds a report of the original with
  the flag gives.
- The findings on an ungrouped stream named ``--group``, an option ``report`` does not have
  for metadata, and said "(vLLM < 0.21)": they now suggest ``--group-meta none=KIND`` and
  say SGLang-like when ``info``'s detection says so.

Real recordings of the real SGLang captures, the real CLI.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtool.cli import app
from kvtool.recording import format as rfmt
from kvtool.recording import open_recording
from tests.recutil import write_capture

runner = CliRunner()


def run(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def report(*args: str) -> dict:
    code, out, err = run("report", *args, "--format", "json")
    assert code == 0, err
    rep: dict = json.loads(out)
    return rep


def without_source(rep: dict) -> dict:
    return {k: v for k, v in rep.items() if k != "source"}


@pytest.mark.parametrize(
    ("name", "rule"),
    [("sglang_full", "none=full_attention"), ("sglang_swa", "none=sliding_window:64")],
)
def test_issue21_copy_keeps_the_none_rule(tmp_path: Path, name: str, rule: str) -> None:
    rec = tmp_path / f"{name}.mcap"
    write_capture(rec, name)
    copy = tmp_path / "copy.mcap"
    code, _out, err = run("replay", str(rec), "--annotate", "--group-meta", rule, "-o", str(copy))
    assert code == 0, err
    # The warning that there was no group metadata was false: the rule was given.
    assert "no store carries a kind to learn from" not in err
    assert "--group IDX" not in err
    # The copy is a valid recording: info and report say nothing is damaged.
    code, out, err = run("info", str(copy), "--format", "json")
    assert code == 0, err
    info = json.loads(out)
    assert info["complete"] and info["recovery"] is None
    with open_recording(copy) as r:
        meta = r.read_metadata()
        for _ in r.messages():
            pass
        assert r.recovery.complete
    assert rfmt.META_GROUPS not in meta  # no empty table
    (stored,) = meta[rfmt.META_UNGROUPED]
    kind, _, window = rule.removeprefix("none=").partition(":")
    assert (stored["kind"], stored["sliding_window"]) == (kind, int(window) if window else None)
    # A report of the copy gives every row the original's with the flag gives.
    of_copy = report(str(copy))
    of_original = report(str(rec), "--group-meta", rule)
    assert without_source(of_copy) == without_source(of_original)
    assert {r["kind"] for r in of_copy["by_kind"]} == {kind}
    assert not [f for f in of_copy["source"]["findings"] if "damaged" in f]
    # replay --annotate of the copy annotates with the stored rule, and says so.
    code, out, err = run("replay", str(copy), "--annotate", "--format", "jsonl")
    assert code == 0, err
    stores = [e for e in map(json.loads, out.splitlines()) if e["type"] == "BlockStored"]
    assert stores and {e["kv_cache_spec_kind"] for e in stores} == {kind}
    assert f"kvtool.ungrouped record (from --group-meta flags): {rule}" in err
    # A copy of the copy keeps it too; a flag on the copy replaces it.
    again = tmp_path / "again.mcap"
    assert run("replay", str(copy), "-o", str(again))[0] == 0
    assert without_source(report(str(again))) == without_source(of_original)
    other = report(str(copy), "--group-meta", "none=mamba")
    assert {r["kind"] for r in other["by_kind"]} == {"mamba"}


def test_issue21_copy_with_flags_alone_is_not_damaged(tmp_path: Path) -> None:
    """Flags that do not name groups 0..N-1 are no table: never stored as a damaged one."""
    rec = tmp_path / "gemma3.mcap"
    write_capture(rec, "gemma3")
    copy = tmp_path / "copy.mcap"
    code, _out, err = run(
        "replay", str(rec), "--annotate", "--group-meta", "1=sliding_window:32",
        "--group-meta", "none=mamba", "-o", str(copy),
    )  # fmt: skip
    assert code == 0, err
    code, _out, err = run("info", str(copy))
    assert code == 0, err
    assert "damaged" not in err


def test_issue21_replay_warning_names_group_meta_none(tmp_path: Path) -> None:
    rec = tmp_path / "sglang_full.mcap"
    write_capture(rec, "sglang_full")
    code, _out, err = run("replay", str(rec), "--annotate", "--format", "jsonl")
    assert code == 0, err
    (line,) = [w for w in err.splitlines() if "warning" in w]
    assert "--group-meta none=KIND[:WINDOW]" in line
    assert "SGLang-like" in line
    assert "--group IDX" not in line
    # With the rule given nothing is left unannotated: no warning.
    code, _out, err = run(
        "replay", str(rec), "--annotate", "--group-meta", "none=full_attention", "--format", "jsonl"
    )
    assert code == 0, err
    assert "warning" not in err


def test_issue21_findings_name_an_option_report_has(tmp_path: Path) -> None:
    code, help_text, _ = run("report", "--help")
    assert code == 0 and "--group-meta" in help_text
    rec = tmp_path / "sglang_swa.mcap"
    write_capture(rec, "sglang_swa")
    findings = report(str(rec))["source"]["findings"]
    ungrouped = [f for f in findings if "no store carries group_idx" in f]
    (stores,) = ungrouped
    assert "SGLang-like" in stores and "--group-meta none=KIND" in stores
    assert "vLLM < 0.21" not in stores
    (removes,) = [f for f in findings if "no remove could be attributed" in f]
    assert "--group-meta none=KIND" in removes and "--groups/--group)" not in removes
    # Doing what the finding says takes it away.
    given = report(str(rec), "--group-meta", "none=sliding_window:64")["source"]["findings"]
    assert not [f for f in given if "no store carries group_idx" in f or "no remove" in f]


def test_issue21_ungrouped_vllm_stream_is_not_called_sglang(tmp_path: Path) -> None:
    """An old vLLM stream without group_idx: the finding names the versions, not SGLang."""
    rec = tmp_path / "legacy.mcap"
    write_capture(rec, "full_only.legacy-array-initial.signed")
    _code, out, _err = run("info", str(rec), "--format", "json")
    assert json.loads(out)["source_like"] is None
    findings = report(str(rec))["source"]["findings"]
    (f,) = [f for f in findings if "no store carries group_idx" in f]
    assert "SGLang-like" not in f
    assert "vLLM before group_idx (~0.21" in f and "--group-meta none=KIND" in f
