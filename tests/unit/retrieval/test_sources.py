"""Source names: paths relative to a root, one name per file however it is reached, clashes refused."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from gatehead.retrieval.sources import find_files

FILES = {"README.md": "# Read me", "guides/router.md": "# Router", "guides/.draft.md": "x", ".git/config.md": "x"}


def names(found: list) -> list[tuple[str, str]]:
    return sorted((f.root, f.source) for f in found)


def test_sources_are_paths_relative_to_the_directory_given(write_corpus: Callable) -> None:
    root = write_corpus(FILES)
    base = root.resolve().as_posix()
    assert names(find_files([root])) == [(base, "README.md"), (base, "guides/router.md")]  # hidden left out
    (router,) = find_files([root / "guides" / "router.md"])  # a lone file: named from its folder
    assert (router.source, router.location) == ("router.md", f"{base}/guides/router.md")
    assert router.path == root / "guides" / "router.md"
    with pytest.raises(ValueError, match="does not exist"):
        find_files([root / "nope"])


def test_a_file_keeps_its_name_however_it_is_reached(write_corpus: Callable) -> None:
    root = write_corpus(FILES)
    base = root.resolve().as_posix()
    # from a root the collection records, or a directory given in the same run: the path under that root
    assert names(find_files([root / "guides" / "router.md"], [base])) == [(base, "guides/router.md")]
    assert names(find_files([root / "guides"], [base])) == [(base, "guides/router.md")]
    assert names(find_files([root / "guides" / "router.md", root])) == [(base, "README.md"),
                                                                        (base, "guides/router.md")]
    # a directory given over a recorded root names its files from the outer directory
    assert names(find_files([root], [f"{base}/guides"])) == [(base, "README.md"), (base, "guides/router.md")]


def test_two_files_with_one_name_are_refused(write_corpus: Callable, tmp_path: Path) -> None:
    first, second = write_corpus(FILES, "kb/a"), write_corpus(FILES, "kb/b")
    with pytest.raises(ValueError, match=rf"would both be source 'README.md'.*holds both \({tmp_path.resolve()}/kb\)"):
        find_files([first, second])
    assert len(find_files([tmp_path / "kb"])) == 4  # their common parent names them apart
