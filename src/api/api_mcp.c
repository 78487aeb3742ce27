/* api_mcp.c -- the Model Context Protocol over streamable HTTP (issue 7)
 *
 * Until it lands both endpoints answer 501 not_implemented. */
#include "api_internal.h"

int api_h_mcp_sandbox(struct api_req *r) {
  return api_reply_error(r, 501, "not_implemented", "MCP is not supported yet");
}
int api_h_mcp_workspace(struct api_req *r) {
  return api_reply_error(r, 501, "not_implemented", "MCP is not supported yet");
}
