"""The LangGraph agent: retrieve -> gate -> answer | refuse | search (bounded)."""
