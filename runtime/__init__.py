"""The runtime: the shared-backbone vLLM engine and the HF transformers reference."""
