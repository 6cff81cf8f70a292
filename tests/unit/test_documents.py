"""Attach's documents (app/chat/documents.py): PDF pages with their numbers, Word paragraphs and
tables, HTML's visible text; each refusal says why."""

from __future__ import annotations

import pytest
from documents_utils import blank_pdf, text_pdf, word_file

from minisgl_app.chat.documents import PDF_PAGE_LIMIT, DocumentError, attachment_text


def test_a_pdf_gives_each_pages_text_under_its_number(tmp_path) -> None:
    pdf = text_pdf(
        tmp_path / "report.pdf", ["The meeting is in Paris.", "", "Budget (2026): 40 euros."]
    )
    text = attachment_text(pdf)
    assert text == "[page 1]\nThe meeting is in Paris.\n\n[page 3]\nBudget (2026): 40 euros."


def test_a_pdf_of_too_many_pages_is_refused_naming_the_limit(tmp_path) -> None:
    pdf = text_pdf(tmp_path / "book.pdf", [f"page {n}" for n in range(500)])
    with pytest.raises(
        DocumentError, match=f"book.pdf has 500 pages.*up to {PDF_PAGE_LIMIT} pages"
    ):
        attachment_text(pdf)


def test_a_pdf_without_text_says_it_is_likely_a_scan(tmp_path) -> None:
    with pytest.raises(DocumentError, match="scan.pdf has no text to read.*OCR"):
        attachment_text(blank_pdf(tmp_path / "scan.pdf"))


def test_a_broken_pdf_is_refused_not_raised(tmp_path) -> None:
    pdf = tmp_path / "cut.pdf"
    pdf.write_bytes(text_pdf(tmp_path / "whole.pdf", ["x"]).read_bytes()[:60])
    with pytest.raises(DocumentError, match="cut.pdf"):
        attachment_text(pdf)


def test_a_word_file_gives_its_paragraphs_and_tables_in_order(tmp_path) -> None:
    docx = word_file(
        tmp_path / "notes.docx",
        ["First point.", "Second point."],
        [["city", "sun"], ["Paris", "18 C"]],
    )
    assert attachment_text(docx) == "First point.\nSecond point.\ncity | sun\nParis | 18 C"


def test_html_gives_its_visible_text(tmp_path) -> None:
    page = tmp_path / "page.html"
    page.write_text(
        "<html><head><title>t</title><style>p{}</style></head><body><h1>Title</h1>"
        "<p>One &amp; <b>two</b></p><script>alert(1)</script><ul><li>three</li></ul></body></html>"
    )
    assert attachment_text(page) == "Title\nOne & two\nthree"


def test_text_files_as_they_are_and_other_bytes_refused(tmp_path) -> None:
    notes = tmp_path / "notes.md"
    notes.write_text("# é\n")
    assert attachment_text(notes) == "# é\n"
    binary = tmp_path / "photo.jpg"
    binary.write_bytes(b"\xff\xd8\xff\xe0" + bytes(100))
    with pytest.raises(DocumentError, match="photo.jpg is not UTF-8 text"):
        attachment_text(binary)
    big = tmp_path / "big.txt"
    big.write_text("x" * 1_000_001)
    with pytest.raises(DocumentError, match="big.txt is larger than 1 MB"):
        attachment_text(big)
