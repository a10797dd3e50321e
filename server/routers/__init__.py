"""The service's routes, one module per API: probes, gate, agent, openai, page."""
