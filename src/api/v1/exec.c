/* exec.c -- POST /v1/sandboxes/{id}/exec: run a command to completion (or start it in the background) */
#include <errno.h>
#include <string.h>

#include "v1.h"

int api_h_exec(struct api_req *r, json_t *body) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  struct moat_exec_req req;
  struct api_exec_extra x;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  /* req borrows cwd and user from body, which outlives it here. */
  if (api_parse_exec_ex(body, API_EXEC_BACKGROUND, &req, &x, &err) < 0)
    return api_reply_moat_error(r, &err);
  if (x.background) {
    int ret = api_exec_background(r, &req, &x);
    api_exec_req_clear(&req);
    return ret;
  }
  struct moat_exec_result res;
  memset(&res, 0, sizeof(res));
  int rc = moat_control_exec(api_control(r), r->org, r->route.id, &req, &res, &err);
  api_exec_req_clear(&req);
  if (rc < 0) {
    api_exec_enoent(r, err);
    return api_reply_moat_error(r, &err);
  }
  int ret = api_reply_json(r, 200, api_exec_result_json(&res));
  moat_exec_result_free(&res);
  return ret;
}
