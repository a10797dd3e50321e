"""The HTTP service: chat, gate and OpenAI-compatible endpoints, and the chat page."""
