"""write_doc_table: benchmarks replace their table in the docs and leave the prose alone."""

from __future__ import annotations

from cadence.observe.report import write_doc_table


def test_table_replaced_between_markers_and_appended_when_missing(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("# T\nbefore\n<!-- t-table-start -->\nold\n<!-- t-table-end -->\nafter\n")
    write_doc_table(doc, "t", "| a |\n|---|")
    assert doc.read_text() == "# T\nbefore\n<!-- t-table-start -->\n| a |\n|---|\n<!-- t-table-end -->\nafter\n"
    write_doc_table(doc, "u", "new")  # no markers yet: appended
    assert doc.read_text().endswith("<!-- u-table-start -->\nnew\n<!-- u-table-end -->\n")
    write_doc_table(tmp_path / "fresh.md", "t", "x")
    assert "<!-- t-table-start -->\nx\n<!-- t-table-end -->" in (tmp_path / "fresh.md").read_text()
