/* rpc.c -- pure helpers of the MCP transport: JSON-RPC message kinds, protocol revisions, headers */
#include <string.h>
#include <strings.h>

#include "mcp.h"

static const char *const mcp_versions[] = {MCP_LATEST_VERSION, "2025-06-18", "2025-03-26", "2024-11-05"};

bool mcp_version_supported(const char *v) {
  for (size_t i = 0; v && i < ARRAY_SIZE(mcp_versions); i++)
    if (strcmp(v, mcp_versions[i]) == 0)
      return true;
  return false;
}

enum mcp_msg_kind mcp_classify(json_t *m, json_t **id, const char **why) {
  *id = NULL;
  if (!json_is_object(m)) {
    *why = "a JSON-RPC message must be an object";
    return MCP_MSG_INVALID;
  }
  json_t *jid = json_object_get(m, "id");
  bool id_ok = jid && (json_is_string(jid) || json_is_integer(jid));
  if (id_ok)
    *id = jid;
  json_t *v = json_object_get(m, "jsonrpc");
  if (!json_is_string(v) || strcmp(json_string_value(v), "2.0") != 0) {
    *why = "\"jsonrpc\" must be \"2.0\"";
    return MCP_MSG_INVALID;
  }
  json_t *method = json_object_get(m, "method");
  if (method) {
    if (!json_is_string(method)) {
      *why = "\"method\" must be a string";
      return MCP_MSG_INVALID;
    }
    if (json_object_get(m, "result") || json_object_get(m, "error")) {
      *why = "a request has no \"result\" or \"error\"";
      return MCP_MSG_INVALID;
    }
    if (!jid)
      return MCP_MSG_NOTIFICATION;
    if (!id_ok) {
      *why = "\"id\" must be a string or an integer";
      return MCP_MSG_INVALID;
    }
    return MCP_MSG_REQUEST;
  }
  if ((json_object_get(m, "result") || json_object_get(m, "error")) && jid)
    return MCP_MSG_RESPONSE;
  *why = "not a request, notification or response (no \"method\")";
  return MCP_MSG_INVALID;
}

bool mcp_media_has(const char *s, const char *type) {
  size_t n = strlen(type);
  while (s && *s) {
    while (*s == ' ' || *s == '\t' || *s == ',')
      s++;
    if (strncasecmp(s, type, n) == 0 &&
        (s[n] == '\0' || s[n] == ';' || s[n] == ',' || s[n] == ' ' || s[n] == '\t'))
      return true;
    s = strchr(s, ',');
  }
  return false;
}

bool mcp_origin_matches(const char *origin, const char *host) {
  if (!origin)
    return true;
  const char *p = strstr(origin, "://");
  if (!host || !p)
    return false;
  p += 3;
  size_t n = strcspn(p, "/");
  return strlen(host) == n && strncasecmp(p, host, n) == 0;
}
