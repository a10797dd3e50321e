"""Loaders: titles, tags and text from each file type; binary, damaged and unsupported files are refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gatehead.retrieval.loaders import Document, Unreadable, load


def write(path: Path, content: str | bytes) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def write_pdf(path: Path, pages: list[str], title: str = "") -> Path:
    """A minimal valid PDF, one Helvetica text line per page, written by hand (correct xref offsets)."""
    n = len(pages)
    objects = ["<< /Type /Catalog /Pages 2 0 R >>",
               f"<< /Type /Pages /Kids [{' '.join(f'{4 + 2 * i} 0 R' for i in range(n))}] /Count {n} >>",
               "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>"]
    for i, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET"
        objects.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents {5 + 2 * i} 0 R "
                       f"/Resources << /Font << /F1 3 0 R >> >> >>")
        objects.append(f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream")
    objects.append(f"<< /Title ({title}) >>")
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    xref = len(out)
    out += f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n".encode()
    out += "".join(f"{o:010d} 00000 n \n" for o in offsets).encode()
    out += f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R /Info {len(objects)} 0 R >>\n".encode()
    out += f"startxref\n{xref}\n%%EOF\n".encode()
    return write(path, out)


def test_markdown_title_and_tags_come_out_of_the_text(tmp_path: Path) -> None:
    md = write(tmp_path / "warranty.md",
               "# Warranty terms\nTags: support, legal\n\nTwo years.\n\n## Claims\nCall us.\n")
    assert load(md, "docs/warranty.md") == [
        Document("Two years.\n\n## Claims\nCall us.", "docs/warranty.md", "Warranty terms", ("support", "legal"))]
    front = write(tmp_path / "front.md", "---\ntitle: 'Router guide'\ntags: [network, wifi]\n---\n\nHold reset.\n")
    assert load(front, "front.md") == [Document("Hold reset.", "front.md", "Router guide", ("network", "wifi"))]
    untitled = write(tmp_path / "notes.markdown", "Just text.\n\n# Later heading\n")
    assert load(untitled, "notes.markdown")[0].title == "notes"  # only a first-line heading is the title


def test_html_keeps_visible_text_with_headings_as_markdown(tmp_path: Path) -> None:
    html = write(tmp_path / "returns.html",
                 "<html><head><title>Returns</title><style>p {color: red}</style></head><body>"
                 "<nav><ul><li>Home</li></ul></nav><h1>Returns policy</h1><p>Return items within\n"
                 "<b>30 days</b>.</p><script>track()</script><h2>Refunds</h2><div>Refunds take a week.</div>"
                 "</body></html>")
    (doc,) = load(html, "returns.html")
    assert doc.title == "Returns"
    assert doc.text == "# Returns policy\n\nReturn items within 30 days.\n\n## Refunds\n\nRefunds take a week."


def test_pdf_text_of_every_page(tmp_path: Path) -> None:
    pdf = write_pdf(tmp_path / "manual.pdf", ["The warranty lasts two years.", "Reset the router."], "Manual")
    (doc,) = load(pdf, "manual.pdf")
    assert doc.title == "Manual" and doc.text == "The warranty lasts two years.\n\nReset the router."
    with pytest.raises(Unreadable, match="not a readable PDF"):
        load(write(tmp_path / "broken.pdf", b"%PDF-1.4\n1 0 obj\n<< /Type /Catalog"), "broken.pdf")


def test_jsonl_records_keep_their_metadata(tmp_path: Path) -> None:
    lines = [json.dumps({"text": "Batteries last 500 cycles.", "title": "Battery", "tags": ["power"],
                         "url": "https://example.com/battery"}), "", json.dumps({"text": "Second.", "line": "L-7"})]
    first, second = load(write(tmp_path / "faq.jsonl", "\n".join(lines)), "faq.jsonl")
    assert first == Document("Batteries last 500 cycles.", "faq.jsonl", "Battery", ("power",),
                             {"url": "https://example.com/battery"}, line=1)
    # the record's own fields stay as they are, a "line" of its own too: the line number is kept apart
    assert (second.meta, second.line, second.title) == ({"line": "L-7"}, 3, "")
    with pytest.raises(Unreadable, match="line 2: expected an object with a 'text' string"):
        load(write(tmp_path / "bad.jsonl", lines[0] + "\n" + json.dumps({"body": "x"})), "bad.jsonl")
    with pytest.raises(Unreadable, match="line 1: not valid JSON"):
        load(write(tmp_path / "worse.jsonl", "{oops"), "worse.jsonl")


@pytest.mark.parametrize("name,content,reason", [
    ("image.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "binary file"),
    ("latin1.md", "café".encode("latin-1"), "not UTF-8 text"),
    ("slides.pptx", b"PK\x03\x04", "unsupported type"),
])
def test_binary_and_unsupported_files_are_unreadable(tmp_path: Path, name: str, content: bytes, reason: str) -> None:
    with pytest.raises(Unreadable, match=reason):
        load(write(tmp_path / name, content), name)


def test_a_file_that_cannot_be_opened_is_unreadable(tmp_path: Path) -> None:
    (tmp_path / "gone.md").symlink_to(tmp_path / "missing.md")
    with pytest.raises(Unreadable, match="cannot read: No such file"):
        load(tmp_path / "gone.md", "gone.md")
