"""gatehead: one loaded LLM serves both the answer and the retrieval gate of a RAG agent.

Importing the package does nothing heavy: torch, transformers and vLLM load only when a
subsystem that needs them is used.
"""

__version__ = "0.1.0"
