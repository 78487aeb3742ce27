/* api_exec.c -- POST /v1/sandboxes/{id}/exec: run a command to completion and return its output */
#include <errno.h>
#include <string.h>

#include "api_internal.h"

int api_h_exec(struct api_req *r, json_t *body) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  struct moat_exec_req req;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  /* req borrows cwd and user from body, which outlives it here. */
  if (api_parse_exec(body, &req, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_exec_result res;
  memset(&res, 0, sizeof(res));
  int rc = moat_control_exec(api_control(r), r->org, r->route.id, &req, &res, &err);
  api_exec_req_clear(&req);
  if (rc < 0 && err && err->status == ENOENT) {
    /* ENOENT means a missing sandbox (404) or, from the guest, a missing cwd: the request is
     * then at fault (400). Tell them apart by asking whether the sandbox is still alive. */
    struct moat_sandbox_info info;
    moat_error *gerr = NULL;
    memset(&info, 0, sizeof(info));
    if (moat_control_get(api_control(r), r->org, r->route.id, &info, &gerr) == 0 && info.state != MOAT_SB_KILLED)
      err->status = EINVAL;
    moat_sandbox_info_clear(&info);
    moat_error_free(&gerr);
  }
  if (rc < 0)
    return api_reply_moat_error(r, &err);
  int ret = api_reply_json(r, 200, api_exec_result_json(&res));
  moat_exec_result_free(&res);
  return ret;
}
