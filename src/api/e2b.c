/* e2b.c -- the E2B wire protocol on moatd's listener (issue 6)
 *
 * Until it lands no request is claimed: E2B paths get the v1 router's 404. */
#include "api_internal.h"

bool api_e2b_claims(struct api_req *r, const char *url, const char *method) {
  (void)r, (void)url, (void)method;
  return false;
}
bool api_e2b_begin(struct api_req *r, const char *url, const char *method) {
  (void)url, (void)method;
  api_reply_error(r, 501, "not_implemented", "the E2B front end is not supported yet");
  return true;
}
int api_e2b_body(struct api_req *r, const char *data, size_t len, moat_error **err) {
  (void)r, (void)data, (void)len, (void)err;
  return 0;
}
void api_e2b_dispatch(struct api_req *r) {
  if (!r->responded)
    api_reply_error(r, 501, "not_implemented", "the E2B front end is not supported yet");
}
