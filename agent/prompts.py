"""The agent's fixed texts: how to answer, how to rewrite a question for search, how to refuse, what to ask back.

The demo model was trained on the instructions and the refusal; a model of your own follows them as
well as its instruction tuning allows. `NOT_FOUND` and `CLARIFY` the agent says itself. Prompt
*layout* (documents, turns, budget) is `gatehead.gate.prompt`'s.
"""

from gatehead.gate.prompt import DEFAULT_SYSTEM

ANSWER_SYSTEM = DEFAULT_SYSTEM
REWRITE_SYSTEM = (
    "Rewrite the user's last question as one standalone question for a document search. Replace order codes, "
    "former names and pronouns with the product name that the documents or the conversation give."
)
# What the model says when the documents lack the answer, and what the agent says when searching ran out.
REFUSAL = "I'm sorry, but the documents do not cover that."
NOT_FOUND = "I could not find this in the documents."
# What the agent asks back when a thread's first question refers to something it never named ("And its weight?").
CLARIFY = "Which product do you mean? Please name it, and I will look it up."
