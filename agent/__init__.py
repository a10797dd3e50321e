"""The LangGraph agent: retrieve -> gate -> answer | refuse | search (bounded).

`Agent` runs turns on threads (`turns.py`); `build_graph` gives the compiled graph (`graph.py`, wiring
and routing), whose nodes (`nodes.py`) take the engine and store from the run's `AgentContext`
(`context.py`); the state and a turn's result are in `state.py`. `gate_node` and `route_on_gate` put
the shared engine's gate into a graph of your own.

The names below load on first use: the agent's prompt texts (`gatehead.agent.prompts`), which training
code reads, import without LangGraph.
"""

from importlib import import_module

_WHERE = {"AgentContext": "context", "Engine": "context", "Retriever": "context", "agent_context": "graph",
          "build_graph": "graph", "gate_decision": "nodes", "gate_node": "nodes", "route_on_gate": "nodes",
          "AgentConfig": "state", "AgentEvent": "state", "AgentState": "state", "Decision": "state",
          "Outcome": "state", "TurnResult": "state", "as_passage": "state", "Agent": "turns"}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'gatehead.agent' has no attribute {name!r}")
    value = getattr(import_module(f"gatehead.agent.{_WHERE[name]}"), name)
    globals()[name] = value
    return value
