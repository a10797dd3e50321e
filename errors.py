"""The one error type that is the caller's to fix.

`InvalidInput` is raised where gatehead validates what a request carries (a prompt, its sampling
settings, a gate's question, documents and thresholds); the HTTP service answers it with 400.
Every other exception is gatehead's own failure (500). It is a `ValueError`, so library callers
that catch `ValueError` keep working.
"""


class InvalidInput(ValueError):
    """A request's input gatehead refuses, with a message saying what to change."""
