#!/usr/bin/env python3
"""langgraph_tool_node.py -- the "run the model's code" tool in the LangGraph shape.

In LangGraph a tool runs in a node: a function that takes the graph state (a dict with a
``messages`` list), executes the tool calls of the last AI message and returns the messages to
append. ``sandbox_tool_node`` below is that node; each graph run (thread) gets its own moat
sandbox, kept in the state as ``sandbox_id`` and reconnected with ``Sandbox.connect``, so state
survives between turns (and between processes, with a checkpointer).

THE MODEL IS STUBBED: no LLM is called. ``stub_model`` replays a fixed list of AI messages with
tool calls (shell commands that write a script, run it, fail, fix it, and run it again), then a
final answer. The tiny loop in ``run_graph`` plays LangGraph's ``StateGraph`` with the edges
model -> tools -> model until the model stops calling tools; with langgraph installed the same two
functions go into ``StateGraph.add_node`` unchanged.

With langgraph installed (and a real model node in place of ``stub_model``)::

    from langgraph.graph import StateGraph, START, END
    g = StateGraph(State)
    g.add_node("model", model_node)
    g.add_node("tools", sandbox_tool_node)
    g.add_edge(START, "model")
    g.add_conditional_edges("model", lambda s: "tools" if s["messages"][-1].tool_calls else END)
    g.add_edge("tools", "model")

    MOAT_API_URL=http://127.0.0.1:7070 MOAT_API_KEY=... python3 examples/python/langgraph_tool_node.py

Exits 0 when the stubbed session ends with the expected answer.
"""

import json
import os
import sys
from typing import Any, Dict, List

try:
    import moat
except ImportError:  # running from a checkout without `pip install ./sdk/python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))
    import moat

State = Dict[str, Any]

SCRIPT_V1 = "def fib(n):\n    return fib(n - 1) + fib(n - 2)\nprint(fib(10))\n"
SCRIPT_V2 = "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\nprint(fib(10))\n"

# The stubbed model: one AI message per turn.
SCRIPTED_AI_MESSAGES: List[Dict[str, Any]] = [
    {"role": "ai", "content": "", "tool_calls": [
        {"id": "c1", "name": "write_file", "args": {"path": "fib.py", "content": SCRIPT_V1}},
        {"id": "c2", "name": "shell", "args": {"command": "python3 fib.py"}}]},
    {"role": "ai", "content": "", "tool_calls": [
        {"id": "c3", "name": "write_file", "args": {"path": "fib.py", "content": SCRIPT_V2}},
        {"id": "c4", "name": "shell", "args": {"command": "python3 fib.py"}}]},
    {"role": "ai", "content": "fib(10) = 55", "tool_calls": []},
]


def stub_model(state: State) -> State:
    """The model node, stubbed: returns the next scripted AI message."""
    turn = sum(1 for m in state["messages"] if m["role"] == "ai")
    return {"messages": [SCRIPTED_AI_MESSAGES[turn]]}


def _sandbox(state: State) -> moat.Sandbox:
    if state.get("sandbox_id"):
        return moat.Sandbox.connect(state["sandbox_id"])
    sb = moat.Sandbox.create(ttl_seconds=900, metadata={"example": "langgraph"})
    state["sandbox_id"] = sb.id
    return sb


def sandbox_tool_node(state: State) -> State:
    """The tool node: runs every tool call of the last AI message in the run's sandbox and returns
    one tool message per call. `shell` returns exit code, stdout and stderr (a traceback included);
    `write_file` writes a file."""
    sb = _sandbox(state)
    out = []
    for call in state["messages"][-1]["tool_calls"]:
        args = call["args"]
        if call["name"] == "shell":
            r = sb.exec(args["command"], timeout=120)
            content = "exit code %d\n%s%s" % (r.exit_code, r.stdout, r.stderr)
        elif call["name"] == "write_file":
            content = "wrote %d bytes to %s" % (sb.files.write(args["path"], args["content"]).size, args["path"])
        else:
            content = "unknown tool %r" % call["name"]
        out.append({"role": "tool", "tool_call_id": call["id"], "content": content})
    return {"messages": out, "sandbox_id": state["sandbox_id"]}


def run_graph(question: str) -> State:
    """model -> (tools -> model)* until the model answers without tool calls."""
    state: State = {"messages": [{"role": "user", "content": question}], "sandbox_id": None}
    try:
        while True:
            state["messages"] += stub_model(state)["messages"]
            if not state["messages"][-1]["tool_calls"]:
                return state
            update = sandbox_tool_node(state)
            state["messages"] += update["messages"]
            state["sandbox_id"] = update["sandbox_id"]
    finally:
        if state.get("sandbox_id"):
            moat.Sandbox.connect(state["sandbox_id"]).kill()


def main() -> int:
    state = run_graph("What is fib(10)? Write a script and run it.")
    for m in state["messages"]:
        if m["role"] == "tool":  # its first and last line (a traceback's last line names the error)
            lines = m["content"].strip().splitlines() or [""]
            print("tool  %s%s" % (lines[0], (" ... " + lines[-1]) if len(lines) > 1 else ""))
        else:
            print("%-5s %s" % (m["role"], json.dumps(m.get("tool_calls") or m["content"])[:200]))
    tool_out = [m["content"] for m in state["messages"] if m["role"] == "tool"]
    ok = ("RecursionError" in tool_out[1] and tool_out[1].startswith("exit code 1")
          and tool_out[3] == "exit code 0\n55\n" and state["messages"][-1]["content"] == "fib(10) = 55")
    print("example ok" if ok else "example FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
