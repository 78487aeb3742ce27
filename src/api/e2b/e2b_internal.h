/* e2b_internal.h -- what the files of the E2B front end share (e2b.c, envd.c, interp.c)
 *
 * e2b.c claims a request (control-plane path, E2b-Sandbox-Id/E2b-Sandbox-Port headers, or a
 * "PORT-ID.DOMAIN" Host), authenticates it and, for a sandbox call, resolves the sandbox and its
 * org; it then hands port-49983 calls (envd: Connect RPC, /health, /files) to envd.c and
 * port-49999 calls (code interpreter) to interp.c through the functions below. */
#ifndef MOAT_E2B_INTERNAL_H
#define MOAT_E2B_INTERNAL_H

#include "e2b.h"

#define E2B_ENVD_PORT 49983
#define E2B_INTERP_PORT 49999

/* The envdVersion create/connect/list answer. The SDK gates features on it (dist/index.mjs):
 * >= 0.4.0 sends no default user, >= 0.5.2 closeStdin, >= 0.5.7 octet-stream uploads, >= 0.6.2
 * file metadata (envd answers 400: not supported), >= 0.6.3 watch includeEntry (served). It stays
 * below 0.6.4 (watching network mounts), which the SDK then refuses itself with TemplateError. */
#define E2B_ENVD_VERSION "0.6.3"

/* r->front of every claimed request. */
struct e2b_req {
  unsigned port;                    /* 0: control plane; else the sandbox port addressed */
  char sandbox_id[MOAT_ID_LEN + 1]; /* sandbox calls: the moat sandbox id */
  char *org;                        /* the org the request acts for (owned), once authenticated */
  bool upload;                      /* a PUT of a template build's files (e2b_template.c) */
  void *sub;                        /* the envd, interpreter or upload handler's state */
  void (*sub_free)(void *);
};

/* Whether org's sandbox id is killed or gone, or becomes so within 2 s while it still shows running
 * (a kill stops its processes a moment before its state says so). A stream whose guest connection
 * failed asks this: when true it drops the client's connection, as E2B's proxy does for a sandbox
 * that went away, rather than sending moat's error. */
bool e2b_sandbox_gone(struct moat_control *ctl, const char *org, const char *id);

/* The front end's state (e2b.c makes it when the api starts). */
struct envd_fs_state;
struct e2b_state {
  uint8_t secret[32];       /* signs the envd access tokens */
  struct envd_fs_state *fs; /* envd_fs.c: users' names cached, polling watchers */
};
struct e2b_state *e2b_state(const struct api_req *r);
struct envd_fs_state *envd_fs_state_new(void);
void envd_fs_state_free(struct envd_fs_state *fs);

/* The sandbox's envd access token (caller frees): what create/connect hand out and what
 * e2b.c checks on every sandbox call (X-Access-Token or E2B-Traffic-Access-Token). */
char *e2b_access_token(const struct api_req *r, const char *org, const char *sandbox_id);

/* envd (envd.c): same contract as api_e2b_begin/body/dispatch, called by e2b.c once the
 * sandbox is resolved and the caller authenticated. */
bool e2b_envd_begin(struct api_req *r, struct e2b_req *e, const char *url, const char *method);
int e2b_envd_body(struct api_req *r, struct e2b_req *e, const char *data, size_t len, moat_error **err);
void e2b_envd_dispatch(struct api_req *r, struct e2b_req *e);

/* code interpreter (interp.c): the same for port 49999. */
bool e2b_interp_begin(struct api_req *r, struct e2b_req *e, const char *url, const char *method);
int e2b_interp_body(struct api_req *r, struct e2b_req *e, const char *data, size_t len, moat_error **err);
void e2b_interp_dispatch(struct api_req *r, struct e2b_req *e);

/* {"code": status, "message"} (e2b.c); e2b_moat_error answers *err's status and frees it. */
int e2b_error(struct api_req *r, unsigned status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
int e2b_moat_error(struct api_req *r, moat_error **err);
void e2b_hmac(const uint8_t *key, size_t klen, const void *msg, size_t mlen, uint8_t out[32]);

/* The template builder (e2b_template.c). dispatch: true when it answered a control-plane call
 * (/v3/templates, /v2/templates/{id}/builds/{bid}, /templates/...). upload_begin: true when the
 * request is the PUT of a build's files (authenticated by its signed URL, not an API key; e->upload
 * set), then with the same contract as api_e2b_begin; body/finish as the api's hooks. */
bool e2b_template_dispatch(struct api_req *r);
bool e2b_template_upload_begin(struct api_req *r, struct e2b_req *e);
int e2b_template_upload_body(struct api_req *r, struct e2b_req *e, const char *data, size_t len,
                             moat_error **err);
void e2b_template_upload_finish(struct api_req *r, struct e2b_req *e);
/* e2b_template_files.c: the signed URL a build's files hash is uploaded to (caller frees); the
 * build context (a tar: "Dockerfile" = df, and each of copies [{i, hash}] unpacked under
 * e2b-files/I/, symlinks leaving it left out with a line in warnings) as *out (caller closes). */
char *e2b_template_upload_url(struct api_req *r, const char *tid, const char *hash);
int e2b_template_context(struct api_req *r, const char *df, size_t df_len, json_t *copies, json_t *warnings,
                         int *out, moat_error **err);
/* A relative path without '..' components or a newline. Pure. */
bool e2b_template_path_ok(const char *s);
/* An E2B template reference "NAME[:TAG]" as moat's NAME (buf, or e2b itself without a tag);
 * *missing when the tag is not one of the template's (or the reference is malformed). */
const char *e2b_template_resolve(struct api_req *r, const char *e2b, char *buf, size_t n, bool *missing);

#endif
