"""The reference pages read in the repository hold the same tables the built site shows: each part generated
from commitline's own code is kept in its page, and must be what the code gives now."""

from __future__ import annotations

import pytest

from tools import docs_reference


def test_every_generated_part_a_page_asks_for_is_known_and_kept_in_the_page() -> None:
    pages = {path.name: docs_reference.blocks(path.read_text()) for path in docs_reference.pages()}
    asked = {name for blocks in pages.values() for name in blocks}
    assert asked == set(docs_reference.GENERATORS), pages
    assert set(docs_reference.COMMITTED) | set(docs_reference.POINTERS) == asked


@pytest.mark.parametrize("path", docs_reference.pages(), ids=lambda p: p.name)
def test_a_reference_page_holds_what_the_code_gives_now(path) -> None:
    for name, held in docs_reference.blocks(path.read_text()).items():
        assert held == docs_reference.kept(name), (
            f"{path.name}: the generated part {name!r} is not what the code gives now: run "
            f"`.venv/bin/python -m tools.docs_reference` to write it")


def test_the_site_replaces_a_kept_part_whole() -> None:
    page = "intro\n\n<!-- generated: metrics -->\n\nstale table\n\n<!-- end of generated: metrics -->\n\nafter\n"
    built = docs_reference.on_page_markdown(page, None, None, None)
    assert "stale table" not in built and "generated" not in built
    assert built.startswith("intro\n\n| metric |") and built.endswith("\n\nafter\n")
