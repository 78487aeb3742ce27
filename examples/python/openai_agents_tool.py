#!/usr/bin/env python3
"""openai_agents_tool.py -- an OpenAI Agents SDK agent (``openai-agents`` from PyPI) whose function
tool runs shell commands in a moat sandbox through the moat Python SDK.

THE MODEL IS SCRIPTED: no LLM is called and nothing is sent to OpenAI (tracing is turned off).
``ScriptedModel`` is an ``agents.Model``: its first response is a ``run_shell`` function call,
its second a final answer that quotes the tool's output, as a model would. Everything else, the
``Agent``, ``function_tool``, ``Runner.run`` and its tool loop, is the real Agents SDK. For a real
model, drop ``model=ScriptedModel()`` (and set OPENAI_API_KEY).

    pip install -r examples/python/requirements.txt
    MOAT_API_URL=http://127.0.0.1:7070 MOAT_API_KEY=$(cat .moat/api-key) \\
        python3 examples/python/openai_agents_tool.py

The tool works in the sandbox named by MOAT_SANDBOX_ID (left running), or else in one it makes,
puts an input file in, and kills at the end. Prints the agent's final answer after "--- answer ---";
exits 0 when the tool's output reached it.
"""

import asyncio
import os
import sys

try:
    import moat
except ImportError:  # running from a checkout without `pip install ./sdk/python`
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sdk", "python"))
    import moat

from agents import (Agent, Model, ModelResponse, ModelSettings, Runner, Usage, function_tool,
                    set_tracing_disabled)
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

INPUT_PATH = "/root/moat-example-input.txt"
COMMAND = "cat %s; echo host=$(hostname)" % INPUT_PATH

_sandbox = None  # set in main()


@function_tool
def run_shell(command: str) -> str:
    """Run a shell command in an isolated Linux sandbox and return its exit code, stdout and stderr.

    Args:
        command: the command line, run by /bin/sh in the sandbox.
    """
    r = _sandbox.exec(command, timeout=60)
    return "exit code %d\n%s%s" % (r.exit_code, r.stdout, r.stderr)


class ScriptedModel(Model):
    """Stands in for the LLM: a run_shell call first, then an answer quoting the tool's output."""

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id=None, conversation_id=None, prompt=None, **kw):
        items = input if isinstance(input, list) else []
        outputs = [it for it in items if isinstance(it, dict) and it.get("type") == "function_call_output"]
        if not outputs:
            assert any(t.name == "run_shell" for t in tools), "the agent offers no run_shell tool"
            call = ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_1", name="run_shell",
                                            arguments='{"command": "%s"}' % COMMAND.replace('"', '\\"'),
                                            status="completed")
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        answer = "The sandbox said:\n" + str(outputs[-1]["output"])
        msg = ResponseOutputMessage(type="message", id="msg_1", role="assistant", status="completed",
                                    content=[ResponseOutputText(type="output_text", text=answer, annotations=[])])
        return ModelResponse(output=[msg], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kw):
        raise NotImplementedError("this example runs the agent with Runner.run (no streaming)")


async def run_agent() -> str:
    agent = Agent(name="sandbox-agent", instructions="Use run_shell to look at the sandbox's files.",
                  tools=[run_shell], model=ScriptedModel())
    result = await Runner.run(agent, "What does %s say, and what is the sandbox's hostname?" % INPUT_PATH)
    return result.final_output


def main() -> int:
    global _sandbox
    set_tracing_disabled(True)  # the Agents SDK would otherwise upload traces to OpenAI
    given = os.environ.get("MOAT_SANDBOX_ID")
    _sandbox = moat.Sandbox.connect(given) if given else moat.Sandbox.create(
        ttl_seconds=600, metadata={"example": "openai-agents"})
    try:
        if not given:
            _sandbox.files.write(INPUT_PATH, "hello from the moat sandbox\n")
        answer = asyncio.run(run_agent())
    finally:
        if not given:
            _sandbox.kill()
    print("--- answer ---\n" + answer.rstrip("\n"))
    ok = answer.startswith("The sandbox said:\nexit code 0\n") and "host=" in answer
    print("example ok" if ok else "example FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
