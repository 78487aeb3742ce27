#!/usr/bin/env python3
"""openai_agents_tool.py -- the "run the model's code" tool in the OpenAI Agents SDK shape.

The tool is one function with a typed signature and a docstring (what ``agents.function_tool``
turns into a JSON-schema tool): it takes Python code, runs it in a moat sandbox's persistent
Python context, and returns the output, or the traceback so that the model can fix its code.

THE MODEL IS STUBBED: no LLM is called. ``MODEL_TOOL_CALLS`` below is the fixed list of tool calls
a model made in one recorded session (a first attempt that fails, then a fix); the loop feeds each
to the tool exactly as the Agents SDK would, and prints what the model would be shown. With the
``openai-agents`` package installed, ``function_tool(run_python)`` gives the real tool object.

With a real model (``pip install openai-agents``) the same function is used as is::

    from agents import Agent, Runner, function_tool
    agent = Agent(name="analyst", instructions="Use run_python to compute answers.",
                  tools=[function_tool(run_python)])
    print(Runner.run_sync(agent, "What is the median of 3 1 4 1 5 9 2 6?").final_output)

    MOAT_API_URL=http://127.0.0.1:7070 MOAT_API_KEY=... python3 examples/python/openai_agents_tool.py

Exits 0 when every tool call returned what the recorded session expects.
"""

import os
import sys

try:
    import moat
except ImportError:  # running from a checkout without `pip install ./sdk/python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))
    import moat

_sandbox = None  # one sandbox per agent session, made on the first tool call
_context = None


def run_python(code: str) -> str:
    """Run Python code in an isolated sandbox and return what it printed plus the value of its
    last expression. Variables and imports persist between calls. If the code raises, the
    traceback is returned instead so that you can fix the code and call this tool again.

    Args:
        code: Python source to run, e.g. "import math\\nmath.sqrt(2)".
    """
    global _sandbox, _context
    if _sandbox is None:
        _sandbox = moat.Sandbox.create("code-interpreter", ttl_seconds=900, metadata={"example": "openai-agents"})
        _context = _sandbox.create_code_context("python")
    ex = _context.run_code(code, timeout=60)
    if ex.error is not None:
        return "Traceback (most recent call last):\n%s\n%s: %s" % (ex.error.traceback, ex.error.name, ex.error.value)
    out = ex.stdout + ex.stderr
    if ex.text is not None:
        out += ex.text + "\n"
    return out or "(no output)"


try:  # the real Agents SDK tool object, when the package is installed
    from agents import function_tool  # type: ignore
    run_python_tool = function_tool(run_python)
except ImportError:
    run_python_tool = None

# The stubbed model: the tool calls it made, in order, with what each must return.
MODEL_TOOL_CALLS = [
    ({"name": "run_python", "arguments": {"code": "data = [3, 1, 4, 1, 5, 9, 2, 6]\nmean = sum(data) / len(dta)"}},
     "NameError"),
    ({"name": "run_python", "arguments": {"code": "mean = sum(data) / len(data)\nprint('mean', mean)\nsorted(data)[len(data) // 2]"}},
     "mean 3.875\n4\n"),
]

TOOLS = {"run_python": run_python}


def main() -> int:
    ok = True
    try:
        for call, expect in MODEL_TOOL_CALLS:
            result = TOOLS[call["name"]](**call["arguments"])
            print(">>> tool call %s(%r)" % (call["name"], call["arguments"]["code"]))
            print(result)
            if expect not in result:
                print("UNEXPECTED: wanted %r in the tool's answer" % expect)
                ok = False
    finally:
        if _sandbox is not None:
            _sandbox.kill()
    print("example ok" if ok else "example FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
