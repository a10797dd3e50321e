"""The LangGraph agent: retrieve -> gate -> answer | refuse | search (bounded).

`Agent` runs turns on threads; `build_graph` gives the compiled graph; `gate_node` and
`route_on_gate` put the shared engine's gate into a graph of your own.
"""

from gatehead.agent.graph import (
    Agent,
    AgentConfig,
    AgentEvent,
    TurnResult,
    as_passage,
    build_graph,
    gate_decision,
    gate_node,
    route_on_gate,
)

__all__ = ["Agent", "AgentConfig", "AgentEvent", "TurnResult", "as_passage", "build_graph", "gate_decision",
           "gate_node", "route_on_gate"]
