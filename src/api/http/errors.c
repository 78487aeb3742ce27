/* errors.c -- the errno-like status of a moat_error -> an HTTP status and an error code (pure) */
#include <errno.h>
#include <string.h>

#include "http.h"

unsigned api_errno_http(int status, const char **code) {
  switch (status) {
  case ENOENT:
  case ESRCH:
    *code = "not_found";
    return 404;
  case EINVAL:
  case ENOTDIR:
  case EISDIR:
  case ENAMETOOLONG:
  case ELOOP:
  case ENOTEMPTY:
  case EXDEV:
    *code = "invalid_request";
    return 400;
  case EBADMSG:
    *code = "invalid_json";
    return 400;
  case EEXIST:
    *code = "already_exists";
    return 409;
  case EBUSY:
    *code = "conflict";
    return 409;
  case EACCES:
  case EPERM:
  case EROFS:
    *code = "forbidden";
    return 403;
  case EMSGSIZE:
  case E2BIG:
  case EFBIG:
    *code = "payload_too_large";
    return 413;
  case ENOSYS:
  case EOPNOTSUPP:
    *code = "not_implemented";
    return 501;
  case ECONNREFUSED:
  case ECONNRESET:
  case EPIPE:
  case EPROTO:
  case EHOSTUNREACH:
    *code = "sandbox_unreachable";
    return 502;
  case EAGAIN:
    *code = "unavailable";
    return 503;
  case API_E_TOO_MANY:
    *code = "too_many_requests";
    return 429;
  case MOAT_E_QUOTA:
    *code = "quota_exceeded";
    return 429;
  case MOAT_E_PAUSED:
    *code = "sandbox_paused";
    return 409;
  case MOAT_E_NO_CONTEXT:
    *code = "context_not_found";
    return 404;
  case MOAT_E_CTX_BUSY:
    *code = "context_busy";
    return 409;
  case MOAT_E_VOLUME_IN_USE:
    *code = "volume_in_use";
    return 409;
  case MOAT_E_NO_VOLUME:
    *code = "volume_not_found";
    return 404;
  case MOAT_E_VOLUME_ATTACHED:
    *code = "volume_attached";
    return 409;
  case MOAT_E_NO_CHECKPOINTS:
    *code = "checkpoints_unavailable";
    return 503;
  case MOAT_E_TEMPLATE_BUILDING:
    *code = "template_building";
    return 409;
  case MOAT_E_TEMPLATE_NOT_READY:
    *code = "template_not_ready";
    return 409;
  case ETIMEDOUT:
    *code = "timeout";
    return 504;
  case ENOSPC:
  case EDQUOT:
    *code = "insufficient_storage";
    return 507;
  default:
    *code = "internal";
    return 500;
  }
}

bool api_quota_detail(const char *msg, char quota[32], long long *limit, long long *use) {
  const char *p = msg ? strstr(msg, "over quota ") : NULL;
  return p && sscanf(p, "over quota %31[a-z_]: limit %lld, use %lld", quota, limit, use) == 3;
}

json_t *api_quota_error_json(const char *msg) {
  json_t *o = api_error_json("quota_exceeded", msg);
  char q[32];
  long long limit, use;
  if (api_quota_detail(msg, q, &limit, &use)) {
    json_object_set_new(o, "quota", json_string(q));
    json_object_set_new(o, "limit", json_integer(limit));
    json_object_set_new(o, "use", json_integer(use));
  }
  return o;
}

void api_exec_enoent(struct api_req *r, moat_error *err) {
  if (!err || err->status != ENOENT)
    return;
  /* ENOENT means a missing sandbox (404) or, from the guest, a missing cwd: the request is
   * then at fault (400). Tell them apart by asking whether the sandbox is still alive. */
  struct moat_sandbox_info info;
  moat_error *gerr = NULL;
  memset(&info, 0, sizeof(info));
  if (moat_control_get(api_control(r), r->org, r->route.id, &info, &gerr) == 0 &&
      info.state != MOAT_SB_KILLED)
    err->status = EINVAL;
  moat_sandbox_info_clear(&info);
  moat_error_free(&gerr);
}
