#!/usr/bin/env python3
"""mcp_client_session.py -- the official Python MCP SDK (``mcp`` from PyPI) as a client of moatd's
fleet MCP endpoint, POST /v1/mcp (docs/mcp.md), over streamable HTTP with the API key as a bearer
token: initialize, tools/list, then create_sandbox, exec and kill_sandbox as tools/call.

This is what an MCP host (an agent framework, an IDE) does on a model's behalf; no model is
involved here: the tool calls are the script's own.

    pip install -r examples/python/requirements.txt
    MOAT_API_URL=http://127.0.0.1:7070 MOAT_API_KEY=$(cat .moat/api-key) \\
        python3 examples/python/mcp_client_session.py

With MOAT_SANDBOX_ID set the exec call goes to that sandbox (left running); without, the session
makes a sandbox with create_sandbox, writes an input file into it with exec, and kills it at the
end with kill_sandbox. Prints what it did, then the exec call's text result after "--- answer ---";
exits 0 when the session went as described.
"""

import asyncio
import json
import os
import shlex
import sys

import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

INPUT_PATH = "/root/moat-example-input.txt"
COMMAND = "cat %s; echo host=$(hostname)" % INPUT_PATH


def text(result) -> str:
    return "\n".join(c.text for c in result.content if c.type == "text")


async def session(url: str, key: str, given: str) -> bool:
    headers = {"Authorization": "Bearer " + key}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=300)) as http:
        async with streamable_http_client(url + "/v1/mcp", http_client=http) as (read, write):
            async with ClientSession(read, write) as s:
                init = await s.initialize()
                print("server %s %s, protocol %s" % (init.server_info.name, init.server_info.version,
                                                     init.protocol_version))
                tools = sorted(t.name for t in (await s.list_tools()).tools)
                print("tools:", ", ".join(tools))
                sid = given
                if not sid:
                    made = await s.call_tool("create_sandbox", {"ttl_seconds": 600})
                    sid = json.loads(text(made))["id"]
                    print("created", sid)
                try:
                    if not given:
                        put = "printf 'hello from the moat sandbox\\n' > %s" % shlex.quote(INPUT_PATH)
                        await s.call_tool("exec", {"sandbox_id": sid, "command": put})
                    run = await s.call_tool("exec", {"sandbox_id": sid, "command": COMMAND})
                    out = text(run)
                finally:
                    if not given:
                        print(text(await s.call_tool("kill_sandbox", {"sandbox_id": sid})))
                ok = (not run.is_error and out.startswith("exit_code: 0\n--- stdout ---\n") and "host=" in out
                      and {"create_sandbox", "exec", "kill_sandbox"} <= set(tools))
                return ok, out


def main() -> int:
    url = os.environ.get("MOAT_API_URL", "http://127.0.0.1:7070").rstrip("/")
    ok, out = asyncio.run(session(url, os.environ["MOAT_API_KEY"], os.environ.get("MOAT_SANDBOX_ID", "")))
    print("--- answer ---\n" + out.rstrip("\n"))
    print("example ok" if ok else "example FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
