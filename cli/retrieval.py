"""`gatehead ingest`: documents into the Qdrant store, or a source out of it."""

from __future__ import annotations

import argparse
import os
import sys

from gatehead.retrieval.config import IngestConfig, StoreConfig


def _ingest(args: argparse.Namespace) -> int:
    from gatehead.retrieval.config import EmbedderConfig
    from gatehead.retrieval.embedder import Embedder
    from gatehead.retrieval.ingest import ingest
    from gatehead.retrieval.store import Store

    if bool(args.paths) == bool(args.delete):
        raise ValueError("give PATHs to ingest, or --delete SOURCE: exactly one of the two")
    # the key is for a server only: one in the environment must not break local storage
    api_key = (os.environ.get("QDRANT_API_KEY") or None) if args.url else None
    store_config = StoreConfig(path=args.store, url=args.url, api_key=api_key, collection=args.collection)
    if args.delete:
        with Store(store_config) as store:  # no embedder: deleting needs no model
            missing = [s for s in args.delete if not store.count([s])]
            if missing:
                known = ", ".join(repr(s) for s in sorted({c.source for c in store.stored().values()})[:5]) or "none"
                raise ValueError(f"no chunks of {', '.join(map(repr, missing))} in collection {args.collection!r}: "
                                 f"a source is a path relative to the directory that was ingested (stored: {known})")
            for source in args.delete:
                print(f"deleted {source}: {store.delete_source(source)} chunks")
        return 0
    config = IngestConfig(chunk_tokens=args.chunk_tokens, overlap=args.overlap, batch_size=args.batch_size,
                          prune=not args.keep_removed)
    embedder = Embedder(EmbedderConfig(model=args.model, batch_size=args.batch_size))
    with Store(store_config, embedder) as store:
        report = ingest(args.paths, store, config)
        total = store.count()
    if report.skipped:
        print(f"warning: skipped {len(report.skipped)} files:", file=sys.stderr)
        for skipped in report.skipped:
            print(f"  {skipped.path}: {skipped.reason}", file=sys.stderr)
    print(f"{report.summary()}\ncollection {args.collection!r} in {store_config.location}: {total} chunks")
    return 0


def add_parsers(commands) -> None:
    p = commands.add_parser("ingest", help="index documents into the Qdrant store, or --delete a source",
                            description="Index Markdown, text, HTML, PDF and JSONL files (directories are walked). "
                                        "Re-running is cheap: unchanged chunks are kept, changed files replaced, "
                                        "and files gone from a directory given are removed.")
    p.add_argument("paths", nargs="*", metavar="PATH", help="files or directories to ingest")
    p.add_argument("--delete", action="append", metavar="SOURCE",
                   help="remove a source (its path relative to the ingested directory); repeatable")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--store", default=str(StoreConfig.path), metavar="DIR",
                       help=f"embedded Qdrant storage, one process at a time (default: {StoreConfig.path})")
    where.add_argument("--url", help="a Qdrant server instead (API key from QDRANT_API_KEY)")
    p.add_argument("--collection", default=StoreConfig.collection)
    p.add_argument("--model", help="sentence-transformers model directory (default: bundled all-MiniLM-L6-v2)")
    p.add_argument("--chunk-tokens", type=int, default=IngestConfig.chunk_tokens, help="embedder tokens per chunk")
    p.add_argument("--overlap", type=int, default=IngestConfig.overlap,
                   help="tokens shared by consecutive chunks of a section")
    p.add_argument("--batch-size", type=int, default=IngestConfig.batch_size,
                   help="chunks embedded and written at once")
    p.add_argument("--keep-removed", action="store_true",
                   help="keep the chunks of files gone from a directory given (default: remove them)")
    p.set_defaults(func=_ingest)

