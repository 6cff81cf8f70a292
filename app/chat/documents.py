"""The text of a file attached to a message: plain text as it is, and the text of PDF, Word
(.docx) and HTML documents, so that a model that reads text can be asked about them.

A PDF's text is marked with its page numbers ("[page 3]"), so a reply can say where something
is; a Word document's paragraphs and tables come in document order. A file that cannot be read
raises :class:`DocumentError` with a sentence for the user (too large, too many pages, no text
layer, not what its name says).
"""

from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

TEXT_LIMIT_BYTES = 1_000_000  # a plain text file ("1 MB" in what the user is told)
DOCUMENT_LIMIT_BYTES = 20_000_000  # a PDF or .docx ("20 MB"); the upload limit is the same
PDF_PAGE_LIMIT = 300
TEXT_CHARS_LIMIT = 2_000_000  # what any document may give: more than any model's context


class DocumentError(ValueError):
    """The file is not attached: ``str(exc)`` says why, naming it."""


def attachment_text(file: Path, name: str | None = None) -> str:
    """The text ``file`` attaches, by its content (a PDF, a .docx, HTML) or as UTF-8 text."""
    name = name or file.name
    size = file.stat().st_size
    with file.open("rb") as handle:
        head = handle.read(8)
    suffix = Path(name).suffix.lower()
    if head.startswith(b"%PDF"):
        reader = _pdf_text
    elif head.startswith(b"PK") and suffix == ".docx":
        reader = _docx_text
    else:
        if size > TEXT_LIMIT_BYTES:
            raise DocumentError(f"{name} is larger than 1 MB")
        text = _utf8_text(file, name)
        return _html_text(text) if suffix in (".html", ".htm") else text
    if size > DOCUMENT_LIMIT_BYTES:
        raise DocumentError(f"{name} is larger than 20 MB")
    text = reader(file, name)
    if len(text) > TEXT_CHARS_LIMIT:
        raise DocumentError(f"{name} holds more than {TEXT_CHARS_LIMIT:,} characters of text")
    return text


def _utf8_text(file: Path, name: str) -> str:
    try:
        text = file.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        raise DocumentError(
            f"{name} is not UTF-8 text (Attach reads text files, PDF, .docx and HTML)"
        ) from None
    if "\x00" in text:
        raise DocumentError(f"{name} is not a text file")
    return text


def _pdf_text(file: Path, name: str) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(file)
        if reader.is_encrypted:
            raise DocumentError(f"{name} is encrypted; save it without a password first")
        pages = len(reader.pages)
        if pages > PDF_PAGE_LIMIT:
            raise DocumentError(
                f"{name} has {pages:,} pages; Attach reads PDFs of up to {PDF_PAGE_LIMIT} pages "
                "(save the pages you need as a smaller PDF)"
            )
        texts = [(page.extract_text() or "").strip() for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        if isinstance(exc, DocumentError):
            raise
        raise DocumentError(f"{name} could not be read as a PDF ({exc})") from None
    if not any(texts):
        raise DocumentError(
            f"{name} has no text to read (a scanned PDF holds pictures of pages); "
            "run it through OCR first"
        )
    return "\n\n".join(f"[page {n}]\n{text}" for n, text in enumerate(texts, 1) if text)


def _docx_text(file: Path, name: str) -> str:
    import zipfile

    from docx import Document
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        document = Document(str(file))
    except (zipfile.BadZipFile, KeyError, ValueError) as exc:
        raise DocumentError(f"{name} could not be read as a Word document ({exc})") from None
    lines = []
    for block in document.iter_inner_content():
        if isinstance(block, Paragraph):
            lines.append(block.text)
        elif isinstance(block, Table):
            lines += [" | ".join(cell.text for cell in row.cells) for row in block.rows]
    text = "\n".join(lines).strip()
    if not text:
        raise DocumentError(f"{name} has no text")
    return text


class _TextOfHTML(HTMLParser):
    """The visible text of an HTML page: what scripts and styles hold is left out, block
    elements start new lines."""

    BLOCKS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "pre"}
    HIDDEN = {"script", "style", "noscript", "template", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in self.HIDDEN:
            self.hidden += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.HIDDEN and self.hidden:
            self.hidden -= 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.hidden:
            self.parts.append(data)


def _html_text(html: str) -> str:
    parser = _TextOfHTML()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)


__all__ = ["DocumentError", "attachment_text"]
