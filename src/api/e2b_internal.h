/* e2b_internal.h -- what the files of the E2B front end share (e2b.c, e2b_envd.c, e2b_interp.c)
 *
 * e2b.c claims a request (control-plane path, E2b-Sandbox-Id/E2b-Sandbox-Port headers, or a
 * "PORT-ID.DOMAIN" Host), authenticates it and, for a sandbox call, resolves the sandbox and its
 * org; it then hands port-49983 calls (envd: Connect RPC, /health, /files) to e2b_envd.c and
 * port-49999 calls (code interpreter) to e2b_interp.c through the functions below. */
#ifndef MOAT_E2B_INTERNAL_H
#define MOAT_E2B_INTERNAL_H

#include "api_internal.h"

#define E2B_ENVD_PORT 49983
#define E2B_INTERP_PORT 49999

/* r->front of every claimed request. */
struct e2b_req {
  unsigned port;                   /* 0: control plane; else the sandbox port addressed */
  char sandbox_id[MOAT_ID_LEN + 1]; /* sandbox calls: the moat sandbox id */
  char *org;                       /* the org the request acts for (owned), once authenticated */
  void *sub;                       /* the envd or interpreter handler's state */
  void (*sub_free)(void *);
};

/* envd (e2b_envd.c): same contract as api_e2b_begin/body/dispatch, called by e2b.c once the
 * sandbox is resolved and the caller authenticated. */
bool e2b_envd_begin(struct api_req *r, struct e2b_req *e, const char *url, const char *method);
int e2b_envd_body(struct api_req *r, struct e2b_req *e, const char *data, size_t len, moat_error **err);
void e2b_envd_dispatch(struct api_req *r, struct e2b_req *e);

/* code interpreter (e2b_interp.c): the same for port 49999. */
bool e2b_interp_begin(struct api_req *r, struct e2b_req *e, const char *url, const char *method);
int e2b_interp_body(struct api_req *r, struct e2b_req *e, const char *data, size_t len, moat_error **err);
void e2b_interp_dispatch(struct api_req *r, struct e2b_req *e);

#endif
