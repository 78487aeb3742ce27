/* mcp.h -- what the MCP transport (mcp.c) and its tools (tools.c) share */
#ifndef MOAT_API_MCP_H
#define MOAT_API_MCP_H

#include <jansson.h>
#include <stdbool.h>

#include "../http/http.h"

enum mcp_endpoint {
  MCP_EP_SANDBOX,   /* POST /v1/sandboxes/{id}/mcp: shell, read_file, write_file, list_dir */
  MCP_EP_WORKSPACE, /* POST /v1/mcp: create, list, exec in, fork, hibernate, kill sandboxes */
};

/* One tools/call: the request it came with (org, sandbox id, control) and how to report bad
 * arguments. */
struct mcp_call {
  struct api_req *r;
  enum mcp_endpoint ep;
  /* Protocol 2025-11-25 and later (SEP-1303): arguments that fail the tool's input schema are a
   * tool execution error (isError) the model can correct; earlier revisions: JSON-RPC -32602. */
  bool bad_args_as_result;
};

/* ---- pure helpers (rpc.c) ---- */

#define MCP_LATEST_VERSION "2025-11-25" /* also what a client asking for an unknown revision gets */

/* True for a protocol revision this server speaks: 2025-11-25, 2025-06-18, 2025-03-26, 2024-11-05. */
bool mcp_version_supported(const char *v);

enum mcp_msg_kind { MCP_MSG_INVALID, MCP_MSG_REQUEST, MCP_MSG_NOTIFICATION, MCP_MSG_RESPONSE };
/* Classifies a JSON-RPC 2.0 message (MCP rules: an id is a string or an integer, never null). *id
 * (borrowed from m) is the request id when one could be read, also for MCP_MSG_INVALID, where *why
 * says what is wrong. */
enum mcp_msg_kind mcp_classify(json_t *m, json_t **id, const char **why);

/* True when the comma-separated media type list s (an Accept or Content-Type value) holds type,
 * compared without case and parameters. */
bool mcp_media_has(const char *s, const char *type);

/* True when origin (an Origin header, or NULL when absent) names host (the Host header) as
 * "scheme://HOST"; false for any other origin, "null" included (DNS rebinding protection). */
bool mcp_origin_matches(const char *origin, const char *host);

/* ---- tools (tools.c) ---- */

/* The tools of an endpoint as the tools/list "tools" array (new reference), each annotated
 * readOnlyHint; reads_only (a readonly key) lists only the tools that change nothing. */
json_t *mcp_tools_list(enum mcp_endpoint ep, bool reads_only);

/* Runs tool name with args (an object, borrowed). Returns a CallToolResult object
 * {content: [{type: "text", text}...], isError} (new reference); a tool that fails returns such
 * a result with isError true. Returns NULL for a protocol error: *rpc_code is the JSON-RPC code
 * (-32602 for an unknown tool or, before 2025-11-25, invalid arguments) and *rpc_msg its
 * message (caller frees). */
json_t *mcp_tool_call(const struct mcp_call *c, const char *name, json_t *args, int *rpc_code,
                      char **rpc_msg);

/* MCP (mcp/): its routes; r->body / r->body_len hold the raw JSON-RPC body. */
extern const struct api_front api_front_mcp;

#endif
