"""Which files an ingestion run covers, and the source name each gets: its path relative to a root.

A root is a directory that names the files under it. A collection remembers the roots its chunks came
from, so a file keeps one name however it is reached: `gatehead ingest docs/` names `docs/guides/x.md`
`guides/x.md`, and so does a later `gatehead ingest docs/guides/x.md`. A file or directory inside a
root is named from the outermost root that holds it (a root given in this run or recorded in the
collection); a directory inside none is a root of its own, and a lone file's root is its folder. A
directory given that holds a recorded root names that root's files anew (ingestion then replaces
their chunks once). Roots are absolute paths on this machine. This module reads no file and knows no store.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SourceFile:
    """One file of a run: where it is, and what the collection calls it."""

    path: Path  # as found (relative paths stay relative)
    root: str  # absolute POSIX directory that `source` is relative to
    source: str

    @property
    def location(self) -> str:
        """The file's absolute path, as the collection records it (`root`/`source`)."""
        return f"{self.root.rstrip('/')}/{self.source}"


def _outermost(location: Path, roots: Iterable[Path]) -> Path | None:
    holding = [r for r in roots if location.is_relative_to(r)]
    return min(holding, key=lambda r: len(r.parts)) if holding else None


def find_files(paths: Sequence[str | Path], roots: Iterable[str] = ()) -> list[SourceFile]:
    """Every file under `paths`, named from `roots` (the collection's) and the directories given.

    Hidden files and folders under a directory given are left out. Two files that would get one
    name raise `ValueError`, before anything is read.
    """
    given = [Path(p) for p in paths]
    for path in given:
        if not (path.exists() or path.is_symlink()):
            raise ValueError(f"{path} does not exist: give files or directories to ingest")
    known = [Path(r) for r in roots] + [p.resolve() for p in given if p.is_dir()]
    found: dict[str, SourceFile] = {}
    for path in given:
        if path.is_dir():
            base = path.resolve()
            files = [(p, base / p.relative_to(path)) for p in sorted(path.rglob("*"))
                     if not p.is_dir() and not any(part.startswith(".") for part in p.relative_to(path).parts)]
        else:  # the folder resolved, not the file: a link keeps its own name
            files = [(path, path.parent.resolve() / path.name)]
        for file, location in files:
            root = _outermost(location, known) or location.parent
            named = SourceFile(file, root.as_posix(), location.relative_to(root).as_posix())
            other = found.setdefault(named.source, named)
            if other.location != named.location:
                raise ValueError(f"{other.path} and {file} would both be source {named.source!r} (a path relative "
                                 f"to the directory ingested): ingest a directory that holds both "
                                 f"({os.path.commonpath([other.location, named.location])}), or ingest them into "
                                 f"separate collections (--collection)")
    return list(found.values())
