"""Evals: answer stability, gate agreement, KV cost, offline runs over retrieval datasets."""
