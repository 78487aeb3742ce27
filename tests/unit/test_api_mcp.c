/* test_api_mcp.c -- the MCP transport's pure helpers: JSON-RPC message kinds, protocol revisions, media
 * types, Origin */
#include <string.h>

#include "api/mcp/mcp.h"
#include "tap.h"

static void kind(const char *text, enum mcp_msg_kind want, const char *want_id) {
  json_error_t je;
  json_t *m = json_loads(text, JSON_DECODE_ANY, &je);
  json_t *id = NULL;
  const char *why = "";
  enum mcp_msg_kind k = m ? mcp_classify(m, &id, &why) : (enum mcp_msg_kind) - 1;
  char *ids = id ? json_dumps(id, JSON_ENCODE_ANY) : NULL;
  OK(k == want && ((!want_id && !ids) || (want_id && ids && strcmp(ids, want_id) == 0)),
     "%s -> kind %d id %s (want %d %s) %s", text, k, ids ? ids : "none", want, want_id ? want_id : "none",
     k == MCP_MSG_INVALID ? why : "");
  free(ids);
  json_decref(m);
}

int main(void) {
  kind("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"ping\"}", MCP_MSG_REQUEST, "1");
  kind("{\"jsonrpc\":\"2.0\",\"id\":\"a\",\"method\":\"tools/list\",\"params\":{}}", MCP_MSG_REQUEST,
       "\"a\"");
  kind("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", MCP_MSG_NOTIFICATION, NULL);
  kind("{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{}}", MCP_MSG_RESPONSE, "3");
  kind("{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":{\"code\":1,\"message\":\"x\"}}", MCP_MSG_RESPONSE, "3");
  kind("{\"jsonrpc\":\"2.0\",\"id\":null,\"method\":\"ping\"}", MCP_MSG_INVALID, NULL);
  kind("{\"jsonrpc\":\"2.0\",\"id\":1.5,\"method\":\"ping\"}", MCP_MSG_INVALID, NULL);
  kind("{\"jsonrpc\":\"2.0\",\"id\":[1],\"method\":\"ping\"}", MCP_MSG_INVALID, NULL);
  kind("{\"jsonrpc\":\"1.0\",\"id\":7,\"method\":\"ping\"}", MCP_MSG_INVALID, "7");
  kind("{\"id\":7,\"method\":\"ping\"}", MCP_MSG_INVALID, "7");
  kind("{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":5}", MCP_MSG_INVALID, "7");
  kind("{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\",\"result\":{}}", MCP_MSG_INVALID, "7");
  kind("{\"jsonrpc\":\"2.0\",\"result\":{}}", MCP_MSG_INVALID, NULL);
  kind("{\"jsonrpc\":\"2.0\",\"id\":8}", MCP_MSG_INVALID, "8");
  kind("42", MCP_MSG_INVALID, NULL);
  kind("[]", MCP_MSG_INVALID, NULL);
  kind("\"x\"", MCP_MSG_INVALID, NULL);

  OK(mcp_version_supported("2025-11-25") && mcp_version_supported("2025-06-18") &&
         mcp_version_supported("2025-03-26") && mcp_version_supported("2024-11-05"),
     "the four revisions are supported");
  OK(!mcp_version_supported("2024-10-07") && !mcp_version_supported("") && !mcp_version_supported(NULL) &&
         !mcp_version_supported("2025-11-25 "),
     "others are not");
  OK(strcmp(MCP_LATEST_VERSION, "2025-11-25") == 0, "latest is 2025-11-25");

  OK(mcp_media_has("application/json", "application/json"), "exact media type");
  OK(mcp_media_has("Application/JSON; charset=utf-8", "application/json"), "case and parameters ignored");
  OK(mcp_media_has("application/json, text/event-stream", "text/event-stream"), "second of a list");
  OK(mcp_media_has("text/html,application/json;q=0.9", "application/json"), "list without spaces");
  OK(!mcp_media_has("application/jsonx", "application/json"), "a longer type is another type");
  OK(!mcp_media_has("text/plain", "application/json") && !mcp_media_has("", "application/json") &&
         !mcp_media_has(NULL, "application/json"),
     "absent types");

  OK(mcp_origin_matches(NULL, "127.0.0.1:7070"), "no Origin is fine");
  OK(mcp_origin_matches("http://127.0.0.1:7070", "127.0.0.1:7070"), "same host and port");
  OK(mcp_origin_matches("https://MOAT.example", "moat.example"), "host without port, case ignored");
  OK(mcp_origin_matches("http://127.0.0.1:7070/path", "127.0.0.1:7070"),
     "a path after the origin is ignored");
  OK(!mcp_origin_matches("http://evil.example", "127.0.0.1:7070"), "another host");
  OK(!mcp_origin_matches("http://127.0.0.1:7071", "127.0.0.1:7070"), "another port");
  OK(!mcp_origin_matches("http://127.0.0.1:70", "127.0.0.1:7070"), "a prefix of the host is not the host");
  OK(!mcp_origin_matches("null", "127.0.0.1:7070") && !mcp_origin_matches("http://x", NULL),
     "null origin, no Host");
  return tap_done();
}
