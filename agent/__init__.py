"""The LangGraph agent: retrieve -> gate -> answer | refuse | search (bounded).

`Agent` runs turns on threads (`turns.py`); `build_graph` gives the compiled graph (`graph.py`, wiring
and routing), whose nodes (`nodes.py`) take the engine and store from the run's `AgentContext`
(`context.py`); the state and a turn's result are in `state.py`. `gate_node` and `route_on_gate` put
the shared engine's gate into a graph of your own.
"""

from gatehead.agent.context import AgentContext, Engine, Retriever
from gatehead.agent.graph import agent_context, build_graph
from gatehead.agent.nodes import gate_decision, gate_node, route_on_gate
from gatehead.agent.state import AgentConfig, AgentEvent, AgentState, Decision, Outcome, TurnResult, as_passage
from gatehead.agent.turns import Agent

__all__ = ["Agent", "AgentConfig", "AgentContext", "AgentEvent", "AgentState", "Decision", "Engine", "Outcome",
           "Retriever", "TurnResult", "agent_context", "as_passage", "build_graph", "gate_decision", "gate_node",
           "route_on_gate"]
