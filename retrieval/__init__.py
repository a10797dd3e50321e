"""Retrieval: Qdrant store, sentence-transformers embeddings, ingestion."""
