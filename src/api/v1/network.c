/* network.c -- GET/PUT /v1/sandboxes/{id}/network and GET /v1/sandboxes/{id}/network/log */
#include <errno.h>
#include <string.h>

#include "../../common/util.h"
#include "v1.h"

#define LOG_DEFAULT_LIMIT 1000
#define LOG_MAX_LIMIT 1024

int api_h_network_get(struct api_req *r, json_t *body) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *j = moat_control_network_get(api_control(r), r->org, r->route.id, &err);
  if (!j)
    return api_reply_moat_error(r, &err);
  return api_reply_json(r, 200, j);
}

int api_h_network_put(struct api_req *r, json_t *body) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  json_t *j = moat_control_network_set(api_control(r), r->org, r->route.id, body, &err);
  if (!j)
    return api_reply_moat_error(r, &err);
  return api_reply_json(r, 200, j);
}

int api_h_network_log(struct api_req *r, json_t *body) {
  static const char *const allowed[] = {"since", "limit", NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return api_reply_moat_error(r, &err);
  uint64_t since = 0, limit = LOG_DEFAULT_LIMIT;
  const char *s = api_arg_get(&r->args, "since"), *l = api_arg_get(&r->args, "limit");
  if (s && parse_u64(s, &since) < 0)
    return api_reply_error(r, 400, "invalid_request", "query parameter 'since' must be a sequence number");
  if (l && (parse_u64(l, &limit) < 0 || limit < 1 || limit > LOG_MAX_LIMIT))
    return api_reply_error(r, 400, "invalid_request", "query parameter 'limit' must be from 1 to %d",
                           LOG_MAX_LIMIT);
  json_t *arr = moat_control_network_log(api_control(r), r->org, r->route.id, since, (unsigned)limit, &err);
  if (!arr)
    return api_reply_moat_error(r, &err);
  return api_reply_json(r, 200, json_pack("{s:o}", "connections", arr));
}
