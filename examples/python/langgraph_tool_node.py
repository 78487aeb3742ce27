#!/usr/bin/env python3
"""langgraph_tool_node.py -- a LangGraph graph (``langgraph`` + ``langchain-core`` from PyPI) whose
tool node runs shell commands in a moat sandbox through the moat Python SDK.

The graph is LangGraph's own: ``StateGraph(MessagesState)`` with a model node and a prebuilt
``ToolNode`` holding the ``run_shell`` tool (a ``langchain_core.tools.tool``), joined by
``tools_condition``, so model -> tools -> model until the model stops calling tools.

THE MODEL IS SCRIPTED: no LLM is called. ``ScriptedChatModel`` is a langchain_core
``BaseChatModel``: while the conversation has no tool result it answers with a ``run_shell`` tool
call; after one it answers with text quoting the tool's output, as a model would. Swap in a real
chat model (``ChatOpenAI(...).bind_tools([run_shell])``) and the graph is unchanged.

    pip install -r examples/python/requirements.txt
    MOAT_API_URL=http://127.0.0.1:7070 MOAT_API_KEY=$(cat .moat/api-key) \\
        python3 examples/python/langgraph_tool_node.py

The tool works in the sandbox named by MOAT_SANDBOX_ID (left running), or else in one it makes,
puts an input file in, and kills at the end. Prints the conversation, then the model's final answer
after "--- answer ---"; exits 0 when the tool's output reached it.
"""

import os
import sys
from typing import Any, List, Optional

try:
    import moat
except ImportError:  # running from a checkout without `pip install ./sdk/python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))
    import moat

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

INPUT_PATH = "/root/moat-example-input.txt"
COMMAND = "cat %s; echo host=$(hostname)" % INPUT_PATH

_sandbox = None  # set in main()


@tool
def run_shell(command: str) -> str:
    """Run a shell command in an isolated Linux sandbox; returns its exit code, stdout and stderr."""
    r = _sandbox.exec(command, timeout=60)
    return "exit code %d\n%s%s" % (r.exit_code, r.stdout, r.stderr)


class ScriptedChatModel(BaseChatModel):
    """Stands in for the LLM: a run_shell call first, then an answer quoting the tool's output."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(self, messages: List[BaseMessage], stop: Optional[List[str]] = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if not results:
            msg = AIMessage(content="", tool_calls=[{"id": "call_1", "name": "run_shell",
                                                     "args": {"command": COMMAND}}])
        else:
            msg = AIMessage(content="The sandbox said:\n" + str(results[-1].content))
        return ChatResult(generations=[ChatGeneration(message=msg)])


def build_graph():
    model = ScriptedChatModel()

    def call_model(state: MessagesState):
        return {"messages": [model.invoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("model", call_model)
    g.add_node("tools", ToolNode([run_shell]))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", tools_condition)
    g.add_edge("tools", "model")
    return g.compile()


def main() -> int:
    global _sandbox
    given = os.environ.get("MOAT_SANDBOX_ID")
    _sandbox = moat.Sandbox.connect(given) if given else moat.Sandbox.create(
        ttl_seconds=600, metadata={"example": "langgraph"})
    try:
        if not given:
            _sandbox.files.write(INPUT_PATH, "hello from the moat sandbox\n")
        state = build_graph().invoke(
            {"messages": [HumanMessage("What does %s say, and what is the sandbox's hostname?" % INPUT_PATH)]})
    finally:
        if not given:
            _sandbox.kill()
    for m in state["messages"]:
        print("%-6s %s" % (m.type, m.tool_calls if getattr(m, "tool_calls", None) else m.content))
    kinds = [m.type for m in state["messages"]]
    answer = state["messages"][-1].content
    ok = (kinds == ["human", "ai", "tool", "ai"] and answer.startswith("The sandbox said:\nexit code 0\n")
          and "host=" in answer)
    print("--- answer ---\n" + answer.rstrip("\n"))
    print("example ok" if ok else "example FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
