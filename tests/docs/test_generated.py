"""The generated references (docs/reference/options.md, cli.md, json.md) are what
scripts/gen_docs.py makes from the code now: an option, a flag or a JSON key added
without running it again fails here."""

from __future__ import annotations

import subprocess
import sys
import typing
import zipfile
from pathlib import Path

import pytest

from sqlsink.cli import contract
from sqlsink.options import OPTIONS, OptionSpec
from tests.docs.pages import REPO, gen_docs


def test_the_generated_pages_are_what_the_code_generates() -> None:
    assert gen_docs().stale_pages() == [], "run: python scripts/gen_docs.py"


def test_an_option_added_without_regenerating_makes_the_page_stale(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gen = gen_docs()
    added = OptionSpec("schemaDrift", "`off`", "a new option nobody documented")
    monkeypatch.setattr(gen, "OPTIONS", (*OPTIONS, added))
    assert gen.stale_pages() == ["docs/reference/options.md"]


def test_every_object_of_the_contract_is_on_the_json_page() -> None:
    placed = {td for _, objects in gen_docs().SECTIONS for td in objects}
    defined = {v for v in vars(contract).values() if typing.is_typeddict(v)}
    assert defined == placed


def test_every_meaning_names_a_key_the_contract_has() -> None:
    gen = gen_docs()
    keys = {
        f"{td.__name__}.{key}"
        for _, objects in gen.SECTIONS
        for td in objects
        for key in gen.own_keys(td)
    }
    assert sorted(set(gen.MEANINGS) - keys) == []


def test_every_flag_of_the_parser_is_on_the_cli_page() -> None:
    page = gen_docs().cli_page()
    for flag in ("--url", "--commit-lost", "--mark-skipped", "--max-age", "--partitions"):
        assert f"`{flag} " in page or f"`{flag}`" in page, flag


def test_the_wheel_carries_the_json_contract(tmp_path: Path) -> None:
    """Where the CLI runs, its --json contract is at hand: sqlsink/cli/json-contract.md."""
    build = "import sys, hatchling.build as b; print(b.build_wheel(sys.argv[1]))"
    done = subprocess.run(
        [sys.executable, "-c", build, str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    wheel = tmp_path / done.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as archive:
        shipped = archive.read("sqlsink/cli/json-contract.md").decode()
    assert shipped == (REPO / "docs" / "reference" / "json.md").read_text(encoding="utf-8")
