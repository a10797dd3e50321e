"""The README's gate-in-your-own-graph example, run as written on the demo model."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from gatehead.testing import states

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_gate_node_example_runs(demo_shared, loop, tmp_path: Path) -> None:
    text = README.read_text(encoding="utf-8")
    code = re.search(r"<!-- example: gate-node -->\n```python\n(.*?)```", text, re.S).group(1)
    path = tmp_path / "gate_in_your_graph.py"
    path.write_text(code, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("gate_in_your_graph", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # not as __main__: the example's engine is not started
    rowan, ghost = loop.run(module.main(demo_shared))
    assert [d["source"] for d in rowan["documents"]] == ["rowan.md", "vale.md"]  # both share "lantern"
    assert rowan["gate"]["decision"] == "answer" and states(rowan["reply"], "€354")
    assert set(rowan["gate"]["probs"]) == {"answer", "refuse", "search"}
    # A product that does not exist: the retriever finds its namesakes (both lanterns), the gate refuses.
    assert [d["source"] for d in ghost["documents"]] == ["rowan.md", "vale.md"]
    assert ghost["gate"]["decision"] == "refuse"
    assert ghost["reply"] == "That is outside what I know."
