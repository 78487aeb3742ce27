/* e2b_template.c -- E2B's template builder (the SDK's Template.build) on moat's Dockerfile builds
 *
 * What the SDK sends (js-sdk src/template/buildApi.ts, python-sdk e2b/template_sync/build_api.py):
 *   POST /v3/templates {name: "NAME[:TAG]", tags, cpuCount, memoryMB} -> 202 {templateID, buildID,
 *     names, tags, aliases, public}: templateID is the moat template name, buildID a UUID of ours.
 *   GET /templates/{tid}/files/{hash} -> 201 {present, url}: url is this moatd's, signed (below);
 *     the SDK PUTs the tar.gz of a copy() there with no API key.
 *   POST /v2/templates/{tid}/builds/{bid} {fromTemplate|fromImage, steps, startCmd, readyCmd, force}
 *     -> 202: the steps become a Dockerfile (make_dockerfile) and the uploads a build context, which
 *     moat_control_template_submit builds as the org's template tid.
 *   GET /templates/{tid}/builds/{bid}/status?logsOffset=&limit=&level= -> 200 {status: waiting|
 *     building|ready|error, logEntries, logs, reason}: the moat build log's records as log entries.
 *   GET /templates/aliases/{alias} -> 200 {templateID, public} or 404 (Template.exists).
 *   POST|DELETE /templates/tags, GET /templates/{tid}/tags; DELETE /templates/{tid}.
 * Notes per template (moat_control_build_notes_*): {builds: {BID: {moat, lines, warnings}}, tags:
 * {TAG: {build, at}}}. A tag names  a build; a create from NAME:TAG needs the tag to exist and gets the
 * template's last ready build (moat keeps one image per template name).
 *
 * The upload URL: /templates/{tid}/files/{hash}?org=HEX(org)&exp=UNIX_S&sig=HEX(HMAC-SHA256(secret,
 * "upload\0" org "\0" tid "\0" hash "\0" exp)); valid for UPLOAD_TTL_S. */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <stdarg.h>
#include <microhttpd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../../common/buf.h"
#include "../../common/json_cleanup.h"
#include "../../common/sha256.h"
#include "e2b_internal.h"

#define MAX_BUILDS_NOTED 16
#define MAX_TAGS 64
#define STATUS_MAX_ENTRIES 100
#define MAX_STEPS 400
#define FILES_DIR "e2b-files"

/* ---- paths ---- */

struct tpath {
  const char *seg[7];
  size_t n;
  char buf[512];
};

static bool split(const char *url, struct tpath *p) {
  memset(p, 0, sizeof(*p));
  if (strlen(url) >= sizeof(p->buf))
    return false;
  snprintf(p->buf, sizeof(p->buf), "%s", url);
  char *save = NULL;
  for (char *t = strtok_r(p->buf, "/", &save); t; t = strtok_r(NULL, "/", &save)) {
    if (p->n == 7)
      return false;
    p->seg[p->n++] = t;
  }
  return p->n > 0;
}

static bool seg_is(const struct tpath *p, size_t i, const char *s) {
  return i < p->n && strcmp(p->seg[i], s) == 0;
}

/* ---- names and tags ---- */

/* "NAME[:TAG]" -> name (into buf) and tag (NULL when none). EINVAL naming what is wrong. */
static int split_name(const char *full, char *name, size_t n, const char **tag, moat_error **err) {
  const char *colon = strchr(full, ':');
  size_t len = colon ? (size_t)(colon - full) : strlen(full);
  if (len == 0 || len >= n)
    return moat_error_set(err, EINVAL, "'%.80s': a template name is 1..63 characters of [a-z0-9._-]", full);
  memcpy(name, full, len);
  name[len] = '\0';
  if (!api_valid_template_name(name))
    return moat_error_set(
        err, EINVAL,
        "'%.80s': a template name is 1..63 characters of [a-z0-9._-] starting with a letter "
        "or digit",
        name);
  *tag = colon ? colon + 1 : NULL;
  return 0;
}

static bool tag_valid(const char *t) {
  size_t n = t ? strlen(t) : 0;
  if (n == 0 || n > 128)
    return false;
  for (const char *p = t; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
          *p == '_' || *p == '-'))
      return false;
  return true;
}

static void uuid4(char out[37]) {
  uint8_t b[16];
  random_bytes(b, sizeof(b));
  b[6] = (uint8_t)((b[6] & 0x0f) | 0x40);
  b[8] = (uint8_t)((b[8] & 0x3f) | 0x80);
  snprintf(out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
           b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static bool is_recipe(struct api_req *r, const char *name) {
  return strcmp(name, "code-interpreter-v1") == 0 || moat_control_template_exists(api_control(r), name);
}

static const char *recipe_of(const char *e2b) {
  return strcmp(e2b, "code-interpreter-v1") == 0 ? "code-interpreter" : e2b;
}

/* The notes of org's template name (an object, owned; empty when none). */
static json_t *notes_get(struct api_req *r, const char *name, moat_error **err) {
  json_t *doc = NULL;
  if (moat_control_build_notes_get(api_control(r), r->org, name, &doc, err) < 0)
    return NULL;
  if (!doc)
    doc = json_object();
  if (!json_is_object(json_object_get(doc, "builds")))
    json_object_set_new(doc, "builds", json_object());
  if (!json_is_object(json_object_get(doc, "tags")))
    json_object_set_new(doc, "tags", json_object());
  return doc;
}

/* True when org has a usable (or building) template name: its own, or a recipe. */
static bool template_known(struct api_req *r, const char *name) {
  return api_valid_template_name(name) && moat_control_template_known(api_control(r), r->org, name);
}

const char *e2b_template_resolve(struct api_req *r, const char *e2b, char *buf, size_t n, bool *missing) {
  *missing = false;
  const char *colon = strchr(e2b, ':');
  if (!colon)
    return e2b;
  const char *tag = NULL;
  moat_error *err = NULL;
  if (split_name(e2b, buf, n, &tag, &err) < 0 || !tag_valid(tag)) {
    moat_error_free(&err);
    *missing = true;
    return e2b;
  }
  if (is_recipe(r, buf) && (strcmp(tag, "default") == 0 || strcmp(tag, "latest") == 0))
    return buf;
  json_t *doc = notes_get(r, buf, &err);
  moat_error_free(&err);
  *missing = !doc || !json_object_get(json_object_get(doc, "tags"), tag);
  json_decref(doc);
  return buf;
}

/* ---- replies ---- */

static int read_json(struct api_req *r, json_t **out) {
  json_error_t je;
  *out = NULL;
  if (!r->body_len)
    return e2b_error(r, 400, "a JSON object body is required"), -1;
  *out = json_loadb(r->body, r->body_len, 0, &je);
  if (!json_is_object(*out)) {
    json_decref(*out);
    *out = NULL;
    return e2b_error(r, 400, "the body is not a JSON object: %s", je.text), -1;
  }
  return 0;
}

/* ---- POST /v3/templates ---- */

static int add_tag(json_t *tags, const char *tag, const char *bid) {
  if (json_object_size(tags) >= MAX_TAGS && !json_object_get(tags, tag))
    return -1;
  json_object_set_new(tags, tag, json_pack("{s:s, s:I}", "build", bid, "at", (json_int_t)now_unix_ms()));
  return 0;
}

static void notes_trim(json_t *builds) {
  while (json_object_size(builds) > MAX_BUILDS_NOTED) {
    const char *oldest = NULL, *k;
    json_int_t at = 0;
    json_t *v;
    json_object_foreach(builds, k, v) {
      json_int_t a = json_integer_value(json_object_get(v, "at"));
      if (!oldest || a < at) {
        oldest = k;
        at = a;
      }
    }
    if (!oldest)
      return;
    json_object_del(builds, oldest);
  }
}

static int h_request_build(struct api_req *r) {
  _cleanup_json_ json_t *body = NULL;
  if (read_json(r, &body) < 0)
    return -1;
  const char *full = json_string_value(json_object_get(body, "name"));
  if (!full)
    full = json_string_value(json_object_get(body, "alias"));
  if (!full)
    return e2b_error(r, 400, "'name' is required (\"NAME\" or \"NAME:TAG\")");
  const char *key;
  json_t *v;
  json_object_foreach(body, key, v) {
    if (strcmp(key, "name") && strcmp(key, "alias") && strcmp(key, "tags") && strcmp(key, "cpuCount") &&
        strcmp(key, "memoryMB") && strcmp(key, "teamID"))
      return e2b_error(r, 400, "unknown field '%.128s'", key);
  }
  char name[64];
  const char *tag = NULL;
  moat_error *err = NULL;
  if (split_name(full, name, sizeof(name), &tag, &err) < 0)
    return e2b_moat_error(r, &err);
  if (is_recipe(r, name))
    return e2b_error(r, 400, "'%s' is a template of moatd's own: choose another name", name);
  _cleanup_json_ json_t *tags_in = json_array();
  if (tag)
    json_array_append_new(tags_in, json_string(tag));
  json_t *t = json_object_get(body, "tags");
  if (t && !json_is_null(t)) {
    if (!json_is_array(t))
      return e2b_error(r, 400, "'tags' must be an array of strings");
    size_t i;
    json_array_foreach(t, i, v) json_array_append(tags_in, v);
  }
  if (json_array_size(tags_in) == 0)
    json_array_append_new(tags_in, json_string("default"));
  size_t i;
  json_array_foreach(tags_in, i, v) {
    if (!tag_valid(json_string_value(v)))
      return e2b_error(r, 400, "tag '%.80s': a tag is 1..128 characters of [A-Za-z0-9._-]",
                       json_is_string(v) ? json_string_value(v) : "(not a string)");
  }
  json_t *cpu = json_object_get(body, "cpuCount"), *mem = json_object_get(body, "memoryMB");
  if ((cpu && !json_is_null(cpu) && (!json_is_integer(cpu) || json_integer_value(cpu) < 1)) ||
      (mem && !json_is_null(mem) && (!json_is_integer(mem) || json_integer_value(mem) < 1)))
    return e2b_error(r, 400, "cpuCount and memoryMB must be positive integers");
  _cleanup_json_ json_t *doc = notes_get(r, name, &err);
  if (!doc)
    return e2b_moat_error(r, &err);
  char bid[37];
  uuid4(bid);
  json_t *builds = json_object_get(doc, "builds");
  json_object_set_new(builds, bid, json_pack("{s:I}", "at", (json_int_t)now_unix_ms()));
  notes_trim(builds);
  json_array_foreach(tags_in, i, v) {
    if (add_tag(json_object_get(doc, "tags"), json_string_value(v), bid) < 0)
      return e2b_error(r, 400, "template '%s' has %d tags, the most moat keeps", name, MAX_TAGS);
  }
  if (moat_control_build_notes_put(api_control(r), r->org, name, doc, &err) < 0)
    return e2b_moat_error(r, &err);
  return api_reply_json(r, 202,
                        json_pack("{s:s, s:s, s:b, s:[s], s:O, s:[s]}", "templateID", name, "buildID", bid,
                                  "public", 0, "names", name, "tags", tags_in, "aliases", name));
}

/* ---- GET /templates/{tid}/files/{hash} ---- */

static int h_file_link(struct api_req *r, const char *tid, const char *hash) {
  if (!api_valid_template_name(tid))
    return e2b_error(r, 404, "template '%.64s' not found", tid);
  if (!moat_build_file_hash_valid(hash))
    return e2b_error(r, 400, "'%.80s' is not a files hash (64 lowercase hex digits)", hash);
  bool present = moat_control_build_file_present(api_control(r), r->org, hash);
  _cleanup_free_ char *url = e2b_template_upload_url(r, tid, hash);
  return api_reply_json(r, 201, json_pack("{s:b, s:s}", "present", present, "url", url));
}

/* ---- POST /v2/templates/{tid}/builds/{bid}: the steps as a Dockerfile ---- */

struct gen {
  struct moat_buf df;
  json_t *lines;    /* the E2B step of each line of df (index 0: line 1) */
  json_t *copies;   /* [{i, hash}] */
  json_t *warnings; /* strings */
  char *user;       /* the user in effect */
  bool forced;      /* the cache was broken already */
};

static void emit(struct gen *g, const char *step, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void emit(struct gen *g, const char *step, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  char *s = NULL;
  if (vasprintf(&s, fmt, ap) < 0)
    abort();
  va_end(ap);
  moat_buf_append(&g->df, s, strlen(s));
  moat_buf_append(&g->df, "\n", 1);
  json_array_append_new(g->lines, json_string(step));
  free(s);
}

static char *json_argv(const char *const *v) {
  json_t *a = json_array();
  for (size_t i = 0; v[i]; i++)
    json_array_append_new(a, json_string(v[i]));
  char *s = json_dumps(a, JSON_COMPACT);
  json_decref(a);
  return s;
}

static bool no_newline(const char *s) { return s && !strchr(s, '\n') && !strchr(s, '\r'); }

static bool user_ok(const char *u) {
  if (!u || !*u || strlen(u) > 64 || *u == '-')
    return false;
  for (const char *p = u; *p; p++)
    if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
          *p == '_' || *p == '-' || *p == ':'))
      return false;
  return true;
}

bool e2b_template_path_ok(const char *s) {
  if (!s || !*s || *s == '/' || !no_newline(s))
    return false;
  const char *p = s;
  while (*p) {
    const char *e = strchr(p, '/');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    if (n == 2 && p[0] == '.' && p[1] == '.')
      return false;
    p += n;
    while (*p == '/')
      p++;
  }
  return true;
}

/* The FROM of a build: "FROM X" in buf. 0, or -1 after answering 400. *recipe: X is base or
 * code-interpreter (E2B's images of those run as "user" in /home/user). */
static int resolve_from(struct api_req *r, json_t *body, char *out, size_t n, bool *recipe) {
  const char *ft = json_string_value(json_object_get(body, "fromTemplate"));
  const char *fi = json_string_value(json_object_get(body, "fromImage"));
  json_t *reg = json_object_get(body, "fromImageRegistry");
  *recipe = false;
  if (reg && !json_is_null(reg))
    return e2b_error(
               r, 400,
               "fromImage with registry credentials needs a container registry, which moat does not reach "
               "(see docs/e2b-compat.md)"),
           -1;
  if (ft) {
    char name[64];
    const char *tag = NULL;
    moat_error *err = NULL;
    if (split_name(ft, name, sizeof(name), &tag, &err) < 0)
      return e2b_moat_error(r, &err), -1;
    const char *m = recipe_of(name);
    if (!template_known(r, m))
      return e2b_error(r, 400,
                       "fromTemplate '%.80s': no such template (moat has base, code-interpreter-v1 and the "
                       "templates you built or imported)",
                       ft),
             -1;
    snprintf(out, n, "%s", m);
    *recipe = moat_control_template_exists(api_control(r), m);
    return 0;
  }
  if (!fi)
    fi = "e2bdev/base";
  static const char *const bases[] = {"e2bdev/base", "e2bdev/base:latest", "docker.io/e2bdev/base",
                                      "docker.io/e2bdev/base:latest", NULL};
  for (size_t i = 0; bases[i]; i++)
    if (strcmp(fi, bases[i]) == 0) {
      snprintf(out, n, "base");
      *recipe = true;
      return 0;
    }
  if (strcmp(fi, "e2bdev/code-interpreter") == 0 || strcmp(fi, "e2bdev/code-interpreter:latest") == 0) {
    snprintf(out, n, "code-interpreter");
    *recipe = true;
    return 0;
  }
  /* FROM a moat template (fromDockerfile("FROM base ...")) */
  if (template_known(r, recipe_of(fi))) {
    snprintf(out, n, "%s", recipe_of(fi));
    *recipe = moat_control_template_exists(api_control(r), out);
    return 0;
  }
  /* an image the org imported (moat template import) under its reference */
  struct moat_user_template *v = NULL;
  size_t nv = 0;
  moat_error *err = NULL;
  if (moat_control_user_template_list(api_control(r), r->org, &v, &nv, &err) < 0)
    return e2b_moat_error(r, &err), -1;
  bool found = false;
  for (size_t i = 0; i < nv && !found; i++)
    if (v[i].usable && v[i].from && strcmp(v[i].source, "oci") == 0 && strcmp(v[i].from, fi) == 0) {
      snprintf(out, n, "%s", v[i].name);
      found = true;
    }
  moat_user_templates_free(v, nv);
  if (found)
    return 0;
  return e2b_error(
             r, 400,
             "fromImage '%.200s' needs a container registry, which moat does not reach: build from a moat "
             "template (fromTemplate('base')) or import the image first (moat template import NAME FILE; "
             "see docs/e2b-compat.md)",
             fi),
         -1;
}

static void set_user(struct gen *g, const char *step, const char *u) {
  emit(g, step, "USER %s", u);
  free(g->user);
  g->user = xstrdup(u);
}

static void maybe_force(struct gen *g, json_t *step, const char *name) {
  if (g->forced || !json_is_true(json_object_get(step, "force")))
    return;
  char id[37];
  uuid4(id);
  emit(g, name, "LABEL moat.e2b.force=\"%s\"", id);
  g->forced = true;
}

/* One step of the SDK's steps; 0, or -1 after answering 400. */
static int gen_step(struct api_req *r, struct gen *g, json_t *st, size_t i) {
  char sname[16];
  snprintf(sname, sizeof(sname), "%zu", i + 1);
  const char *type = json_string_value(json_object_get(st, "type"));
  json_t *args = json_object_get(st, "args");
  if (!type)
    return e2b_error(r, 400, "step %zu: 'type' is required", i + 1), -1;
  if (args && !json_is_array(args))
    return e2b_error(r, 400, "step %zu: 'args' must be an array of strings", i + 1), -1;
  size_t na = json_array_size(args);
  for (size_t k = 0; k < na; k++)
    if (!json_is_string(json_array_get(args, k)))
      return e2b_error(r, 400, "step %zu: 'args' must be an array of strings", i + 1), -1;
#define ARG(k) ((k) < na ? json_string_value(json_array_get(args, (k))) : NULL)
  maybe_force(g, st, sname);
  if (strcmp(type, "RUN") == 0) {
    const char *cmd = ARG(0), *user = ARG(1);
    if (!cmd || !*cmd)
      return e2b_error(r, 400, "step %zu: RUN needs a command", i + 1), -1;
    if (user && *user && !user_ok(user))
      return e2b_error(r, 400, "step %zu: '%.64s' is not a user name", i + 1, user), -1;
    _cleanup_free_ char *prev = g->user ? xstrdup(g->user) : NULL;
    bool other = user && *user && (!prev || strcmp(prev, user) != 0);
    if (other)
      set_user(g, sname, user);
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    _cleanup_free_ char *j = json_argv(argv);
    emit(g, sname, "RUN %s", j);
    if (other)
      set_user(g, sname, prev ? prev : "root");
  } else if (strcmp(type, "COPY") == 0) {
    const char *src = ARG(0), *dest = ARG(1), *user = ARG(2), *mode = ARG(3);
    const char *hash = json_string_value(json_object_get(st, "filesHash"));
    if (!e2b_template_path_ok(src))
      return e2b_error(r, 400, "step %zu: COPY's source must be a path inside the context, without '..'",
                       i + 1),
             -1;
    if (!dest || !*dest || !no_newline(dest))
      return e2b_error(r, 400, "step %zu: COPY needs a destination", i + 1), -1;
    if (!moat_build_file_hash_valid(hash))
      return e2b_error(r, 400, "step %zu: COPY needs the filesHash of its upload", i + 1), -1;
    if (!moat_control_build_file_present(api_control(r), r->org, hash))
      return e2b_error(r, 400, "step %zu: the files of COPY %.200s (%s) were not uploaded", i + 1, src, hash),
             -1;
    if (user && *user && !user_ok(user))
      return e2b_error(r, 400, "step %zu: '%.64s' is not a user name", i + 1, user), -1;
    if (mode && *mode && (strlen(mode) > 4 || strspn(mode, "01234567") != strlen(mode)))
      return e2b_error(r, 400, "step %zu: COPY's mode must be octal (e.g. 0755)", i + 1), -1;
    const char *owner = user && *user ? user : g->user;
    _cleanup_free_ char *s = xasprintf(FILES_DIR "/%zu/%s", i + 1, src);
    bool glob = strpbrk(src, "*?[") != NULL;
    size_t dl = strlen(dest);
    _cleanup_free_ char *d = glob && dest[dl - 1] != '/' ? xasprintf("%s/", dest) : xstrdup(dest);
    const char *argv[] = {s, d, NULL};
    _cleanup_free_ char *j = json_argv(argv);
    _cleanup_free_ char *chown =
        owner && strcmp(owner, "root") != 0 ? xasprintf("--chown=%s ", owner) : xstrdup("");
    _cleanup_free_ char *chmod = mode && *mode ? xasprintf("--chmod=%s ", mode) : xstrdup("");
    emit(g, sname, "COPY %s%s%s", chown, chmod, j);
    json_array_append_new(g->copies, json_pack("{s:I, s:s}", "i", (json_int_t)(i + 1), "hash", hash));
  } else if (strcmp(type, "ENV") == 0) {
    if (na == 0 || na % 2)
      return e2b_error(r, 400, "step %zu: ENV takes key, value pairs", i + 1), -1;
    struct moat_buf b = {0};
    for (size_t k = 0; k < na; k += 2) {
      const char *kk = ARG(k), *vv = ARG(k + 1);
      if (!api_valid_env_name(kk) || !no_newline(vv)) {
        free(b.p);
        return e2b_error(r, 400, "step %zu: ENV '%.64s': a name [A-Za-z_][A-Za-z0-9_]* and a one-line value",
                         i + 1, kk),
               -1;
      }
      _cleanup_free_ char *kv = xasprintf("%s%s=\"", k ? " " : "", kk);
      moat_buf_append(&b, kv, strlen(kv));
      for (const char *p = vv; *p; p++) {
        if (*p == '"' || *p == '\\')
          moat_buf_append(&b, "\\", 1);
        moat_buf_append(&b, p, 1);
      }
      moat_buf_append(&b, "\"", 1);
    }
    emit(g, sname, "ENV %s", b.p);
    free(b.p);
  } else if (strcmp(type, "WORKDIR") == 0) {
    const char *w = ARG(0);
    if (!w || !*w || !no_newline(w))
      return e2b_error(r, 400, "step %zu: WORKDIR needs a path", i + 1), -1;
    emit(g, sname, "WORKDIR %s", w);
  } else if (strcmp(type, "USER") == 0) {
    const char *u = ARG(0);
    if (!user_ok(u))
      return e2b_error(r, 400, "step %zu: USER needs a user name", i + 1), -1;
    set_user(g, sname, u);
  } else {
    return e2b_error(r, 400, "step %zu: moat does not know the step type '%.32s'", i + 1, type), -1;
  }
#undef ARG
  return 0;
}

static void gen_free(struct gen *g) {
  free(g->df.p);
  json_decref(g->lines);
  json_decref(g->copies);
  json_decref(g->warnings);
  free(g->user);
}

static int h_trigger(struct api_req *r, const char *tid, const char *bid) {
  _cleanup_json_ json_t *body = NULL;
  if (read_json(r, &body) < 0)
    return -1;
  moat_error *err = NULL;
  if (!api_valid_template_name(tid))
    return e2b_error(r, 404, "template '%.64s' not found", tid);
  _cleanup_json_ json_t *doc = notes_get(r, tid, &err);
  if (!doc)
    return e2b_moat_error(r, &err);
  json_t *b = json_object_get(json_object_get(doc, "builds"), bid);
  if (!b)
    return e2b_error(r, 404, "build '%.64s' of template '%s' not found (POST /v3/templates first)", bid, tid);
  if (json_object_get(b, "moat"))
    return e2b_error(r, 409, "build '%.64s' was started already", bid);
  const char *key;
  json_t *v;
  json_object_foreach(body, key, v) {
    if (strcmp(key, "fromTemplate") && strcmp(key, "fromImage") && strcmp(key, "fromImageRegistry") &&
        strcmp(key, "steps") && strcmp(key, "startCmd") && strcmp(key, "readyCmd") && strcmp(key, "force"))
      return e2b_error(r, 400, "unknown field '%.128s'", key);
  }
  json_t *steps = json_object_get(body, "steps");
  if (steps && !json_is_null(steps) && !json_is_array(steps))
    return e2b_error(r, 400, "'steps' must be an array");
  if (json_array_size(steps) > MAX_STEPS)
    return e2b_error(r, 400, "a build has at most %d steps", MAX_STEPS);
  const char *start = json_string_value(json_object_get(body, "startCmd"));
  const char *ready = json_string_value(json_object_get(body, "readyCmd"));
  char from[80];
  bool recipe = false;
  if (resolve_from(r, body, from, sizeof(from), &recipe) < 0)
    return -1;
  struct gen g = {.lines = json_array(), .copies = json_array(), .warnings = json_array()};
  int ret = -1;
  _cleanup_close_ int ctx = -1; /* before the first goto: its cleanup runs at out */
  emit(&g, "base", "FROM %s", from);
  if (json_is_true(json_object_get(body, "force"))) {
    char id[37];
    uuid4(id);
    emit(&g, "base", "LABEL moat.e2b.force=\"%s\"", id);
    g.forced = true;
  }
  if (recipe) { /* E2B's base images run as "user" in its home */
    set_user(&g, "base", "user");
    emit(&g, "base", "WORKDIR /home/user");
  } else {
    struct moat_user_template t = {0};
    if (moat_control_user_template_get(api_control(r), r->org, from, &t, &err) == 0) {
      const char *u = json_string_value(json_object_get(t.config, "user"));
      g.user = u && *u ? xstrdup(u) : NULL;
    }
    moat_error_free(&err);
    moat_user_template_clear(&t);
  }
  size_t i;
  json_t *st;
  json_array_foreach(steps, i, st) {
    if (!json_is_object(st)) {
      e2b_error(r, 400, "step %zu is not an object", i + 1);
      goto out;
    }
    if (gen_step(r, &g, st, i) < 0)
      goto out;
  }
  if (ready && *ready) {
    const char *argv[] = {"/bin/sh", "-c", ready, NULL};
    _cleanup_free_ char *j = json_argv(argv);
    emit(&g, "finalize", "HEALTHCHECK --interval=1s --timeout=30s CMD %s", j);
  }
  if (start && *start) {
    const char *argv[] = {"/bin/sh", "-c", start, NULL};
    _cleanup_free_ char *j = json_argv(argv);
    emit(&g, "finalize", "ENTRYPOINT %s", j);
  }
  if (e2b_template_context(r, g.df.p, g.df.len, g.copies, g.warnings, &ctx, &err) < 0) {
    e2b_moat_error(r, &err);
    goto out;
  }
  struct moat_template_build_req req = {.name = tid, .context_fd = ctx, .dockerfile = "Dockerfile"};
  struct moat_user_template t = {0};
  if (moat_control_template_submit(api_control(r), r->org, &req, &t, &err) < 0) {
    e2b_moat_error(r, &err);
    goto out;
  }
  json_object_set_new(b, "moat", json_string(t.build_id));
  moat_user_template_clear(&t);
  json_object_set(b, "lines", g.lines);
  json_object_set(b, "warnings", g.warnings);
  if (moat_control_build_notes_put(api_control(r), r->org, tid, doc, &err) < 0) {
    e2b_moat_error(r, &err);
    goto out;
  }
  ret = api_reply_empty(r, 202);
out:
  gen_free(&g);
  return ret;
}

/* ---- GET /templates/{tid}/builds/{bid}/status ---- */

static int level_rank(const char *l) {
  if (!l)
    return 1;
  if (strcmp(l, "debug") == 0)
    return 0;
  if (strcmp(l, "warn") == 0)
    return 2;
  if (strcmp(l, "error") == 0)
    return 3;
  return 1;
}

static json_t *entry(int64_t ms, const char *level, const char *msg, const char *step) {
  char ts[40];
  api_rfc3339_ms(ms, ts, sizeof(ts));
  json_t *o = json_pack("{s:s, s:s, s:o}", "timestamp", ts, "level", level, "message", api_str_json(msg));
  if (step)
    json_object_set_new(o, "step", json_string(step));
  return o;
}

static int h_status(struct api_req *r, const char *tid, const char *bid) {
  static const char *const allowed[] = {"logsOffset", "limit", "level", NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, allowed, &err) < 0)
    return e2b_error(r, 400, "%s", moat_error_msg(err)), moat_error_free(&err), -1;
  uint64_t offset = 0, limit = STATUS_MAX_ENTRIES;
  const char *s = api_arg_get(&r->args, "logsOffset"), *l = api_arg_get(&r->args, "limit"),
             *lv = api_arg_get(&r->args, "level");
  if (s && parse_u64(s, &offset) < 0)
    return e2b_error(r, 400, "logsOffset must be a non-negative integer");
  if (l && (parse_u64(l, &limit) < 0 || limit > STATUS_MAX_ENTRIES))
    return e2b_error(r, 400, "limit must be 0..%d", STATUS_MAX_ENTRIES);
  if (lv && strcmp(lv, "debug") && strcmp(lv, "info") && strcmp(lv, "warn") && strcmp(lv, "error"))
    return e2b_error(r, 400, "level must be debug, info, warn or error");
  int min = lv ? level_rank(lv) : 0;
  if (!api_valid_template_name(tid))
    return e2b_error(r, 404, "template '%.64s' not found", tid);
  _cleanup_json_ json_t *doc = notes_get(r, tid, &err);
  if (!doc)
    return e2b_moat_error(r, &err);
  json_t *b = json_object_get(json_object_get(doc, "builds"), bid);
  if (!b)
    return e2b_error(r, 404, "build '%.64s' of template '%s' not found", bid, tid);
  const char *mid = json_string_value(json_object_get(b, "moat"));
  json_t *lines = json_object_get(b, "lines");
  _cleanup_json_ json_t *all = json_array();
  const char *status = "waiting";
  _cleanup_json_ json_t *reason = NULL;
  int64_t at = json_integer_value(json_object_get(b, "at"));
  size_t i;
  json_t *v;
  json_array_foreach(json_object_get(b, "warnings"), i, v)
      json_array_append_new(all, entry(at, "warn", json_string_value(v), NULL));
  if (mid) {
    status = "building";
    _cleanup_json_ json_t *recs = json_array();
    uint64_t off = 0;
    bool ended = false;
    for (;;) {
      size_t before = json_array_size(recs);
      if (moat_control_build_log_read(api_control(r), r->org, tid, mid, &off, recs, &ended, &err) < 0)
        return e2b_moat_error(r, &err);
      if (ended || json_array_size(recs) == before)
        break;
    }
    const char *last_step = "base";
    json_array_foreach(recs, i, v) {
      int64_t ms = json_integer_value(json_object_get(v, "time_ms"));
      const char *state = json_string_value(json_object_get(v, "state"));
      if (state) {
        if (strcmp(state, "ready") == 0) {
          status = "ready";
        } else {
          status = "error";
          const char *e = json_string_value(json_object_get(v, "error"));
          json_array_append_new(all, entry(ms, "error", e ? e : "the build failed", last_step));
          json_t *tail = json_array();
          size_t n = json_array_size(all);
          for (size_t k = n > 10 ? n - 10 : 0; k < n; k++)
            json_array_append(tail, json_array_get(all, k));
          reason = json_pack("{s:s, s:s, s:o}", "message", e ? e : "the build failed", "step", last_step,
                             "logEntries", tail);
        }
        continue;
      }
      json_int_t line = json_integer_value(json_object_get(v, "line"));
      const char *step = json_string_value(json_array_get(lines, (size_t)(line > 0 ? line - 1 : 0)));
      if (step)
        last_step = step;
      const char *stream = json_string_value(json_object_get(v, "stream"));
      const char *text = json_string_value(json_object_get(v, "text"));
      const char *level = stream && strcmp(stream, "stderr") == 0 ? "warn" : "info";
      _cleanup_free_ char *msg = stream && strcmp(stream, "moat") == 0 && !text
                                     ? xstrdup(json_string_value(json_object_get(v, "instruction")))
                                     : xstrdup(text ? text : "");
      json_array_append_new(all, entry(ms, level, msg, step));
    }
  }
  json_t *out = json_array(), *logs = json_array();
  size_t seen = 0;
  json_array_foreach(all, i, v) {
    if (level_rank(json_string_value(json_object_get(v, "level"))) < min)
      continue;
    if (seen++ < offset || json_array_size(out) >= limit)
      continue;
    json_array_append(out, v);
    char line[8192];
    snprintf(line, sizeof(line), "[%s] %s", json_string_value(json_object_get(v, "timestamp")),
             json_string_value(json_object_get(v, "message")));
    json_array_append_new(logs, json_string(line));
  }
  json_t *o = json_pack("{s:o, s:o, s:s, s:s, s:s}", "logEntries", out, "logs", logs, "templateID", tid,
                        "buildID", bid, "status", status);
  if (reason)
    json_object_set(o, "reason", reason);
  return api_reply_json(r, 200, o);
}

/* ---- GET /templates/aliases/{alias} ---- */

static int h_alias(struct api_req *r, const char *alias) {
  char buf[64];
  bool missing = false;
  const char *name = e2b_template_resolve(r, alias, buf, sizeof(buf), &missing);
  if (!missing && is_recipe(r, name))
    return api_reply_json(r, 200, json_pack("{s:s, s:b}", "templateID", name, "public", 1));
  if (!missing && template_known(r, name))
    return api_reply_json(r, 200, json_pack("{s:s, s:b}", "templateID", name, "public", 0));
  return e2b_error(r, 404, "template '%.80s' not found", alias);
}

/* ---- tags ---- */

static int h_tags_assign(struct api_req *r) {
  _cleanup_json_ json_t *body = NULL;
  if (read_json(r, &body) < 0)
    return -1;
  const char *target = json_string_value(json_object_get(body, "target"));
  json_t *tags = json_object_get(body, "tags");
  if (!target || !json_is_array(tags) || json_array_size(tags) == 0)
    return e2b_error(r, 400, "'target' (\"NAME:TAG\") and 'tags' (a non-empty array) are required");
  char name[64];
  const char *tag = NULL;
  moat_error *err = NULL;
  if (split_name(target, name, sizeof(name), &tag, &err) < 0)
    return e2b_moat_error(r, &err);
  if (!tag)
    tag = "default";
  if (!tag_valid(tag))
    return e2b_error(r, 400, "target '%.80s': the tag is 1..128 characters of [A-Za-z0-9._-]", target);
  size_t i;
  json_t *v;
  json_array_foreach(tags, i, v) {
    if (!tag_valid(json_string_value(v)))
      return e2b_error(r, 400, "tag '%.80s': a tag is 1..128 characters of [A-Za-z0-9._-] (no NAME: part)",
                       json_is_string(v) ? json_string_value(v) : "(not a string)");
  }
  if (!template_known(r, name) || is_recipe(r, name))
    return e2b_error(r, 404, "template '%s' not found", name);
  _cleanup_json_ json_t *doc = notes_get(r, name, &err);
  if (!doc)
    return e2b_moat_error(r, &err);
  json_t *t = json_object_get(json_object_get(doc, "tags"), tag);
  if (!t)
    return e2b_error(r, 404, "template '%s' has no tag '%.80s'", name, tag);
  _cleanup_free_ char *bid = xstrdup(json_string_value(json_object_get(t, "build")));
  json_array_foreach(tags, i, v) {
    if (add_tag(json_object_get(doc, "tags"), json_string_value(v), bid) < 0)
      return e2b_error(r, 400, "template '%s' has %d tags, the most moat keeps", name, MAX_TAGS);
  }
  if (moat_control_build_notes_put(api_control(r), r->org, name, doc, &err) < 0)
    return e2b_moat_error(r, &err);
  return api_reply_json(r, 201, json_pack("{s:s, s:O}", "buildID", bid, "tags", tags));
}

static int h_tags_delete(struct api_req *r) {
  _cleanup_json_ json_t *body = NULL;
  if (read_json(r, &body) < 0)
    return -1;
  const char *name = json_string_value(json_object_get(body, "name"));
  json_t *tags = json_object_get(body, "tags");
  if (!name || !json_is_array(tags))
    return e2b_error(r, 400, "'name' and 'tags' (an array) are required");
  if (!template_known(r, name) || is_recipe(r, name))
    return e2b_error(r, 404, "template '%.80s' not found", name);
  moat_error *err = NULL;
  _cleanup_json_ json_t *doc = notes_get(r, name, &err);
  if (!doc)
    return e2b_moat_error(r, &err);
  size_t i;
  json_t *v;
  json_array_foreach(tags, i, v) {
    if (!tag_valid(json_string_value(v)))
      return e2b_error(r, 400, "tag '%.80s' is not a tag", json_is_string(v) ? json_string_value(v) : "");
    json_object_del(json_object_get(doc, "tags"), json_string_value(v));
  }
  if (moat_control_build_notes_put(api_control(r), r->org, name, doc, &err) < 0)
    return e2b_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

static int h_tags_list(struct api_req *r, const char *tid) {
  if (!template_known(r, tid) || is_recipe(r, tid))
    return e2b_error(r, 404, "template '%.80s' not found", tid);
  moat_error *err = NULL;
  _cleanup_json_ json_t *doc = notes_get(r, tid, &err);
  if (!doc)
    return e2b_moat_error(r, &err);
  json_t *out = json_array();
  const char *k;
  json_t *v;
  json_object_foreach(json_object_get(doc, "tags"), k, v) {
    char ts[40];
    api_rfc3339_ms(json_integer_value(json_object_get(v, "at")), ts, sizeof(ts));
    json_array_append_new(out, json_pack("{s:s, s:s, s:s}", "tag", k, "buildID",
                                         json_string_value(json_object_get(v, "build")), "createdAt", ts));
  }
  return api_reply_json(r, 200, out);
}

/* ---- DELETE /templates/{tid} ---- */

static int h_delete(struct api_req *r, const char *tid) {
  char buf[64];
  bool missing = false;
  const char *name = e2b_template_resolve(r, tid, buf, sizeof(buf), &missing);
  if (is_recipe(r, name))
    return e2b_error(r, 403, "'%s' is a template of moatd's own: it cannot be deleted", name);
  if (missing || !template_known(r, name))
    return e2b_error(r, 404, "template '%.80s' not found", tid);
  moat_error *err = NULL;
  if (moat_control_user_template_delete(api_control(r), r->org, name, &err) < 0)
    return e2b_moat_error(r, &err);
  if (moat_control_build_notes_put(api_control(r), r->org, name, NULL, &err) < 0)
    return e2b_moat_error(r, &err);
  return api_reply_empty(r, 204);
}

/* ---- dispatch ---- */

bool e2b_template_dispatch(struct api_req *r) {
  struct tpath p;
  if (!split(r->path, &p))
    return false;
  const char *m = r->method;
  bool get = strcmp(m, "GET") == 0, post = strcmp(m, "POST") == 0, del = strcmp(m, "DELETE") == 0;
  if (seg_is(&p, 0, "v3") && seg_is(&p, 1, "templates") && p.n == 2) {
    post ? h_request_build(r) : e2b_error(r, 405, "method %s is not allowed on %.256s", m, r->path);
    return true;
  }
  if (seg_is(&p, 0, "v2") && seg_is(&p, 1, "templates") && p.n == 5 && seg_is(&p, 3, "builds")) {
    post ? h_trigger(r, p.seg[2], p.seg[4])
         : e2b_error(r, 405, "method %s is not allowed on %.256s", m, r->path);
    return true;
  }
  if (!seg_is(&p, 0, "templates"))
    return false;
  if (p.n == 2 && seg_is(&p, 1, "tags")) {
    if (post)
      h_tags_assign(r);
    else if (del)
      h_tags_delete(r);
    else
      e2b_error(r, 405, "method %s is not allowed on %.256s", m, r->path);
    return true;
  }
  if (p.n == 3 && seg_is(&p, 1, "aliases")) {
    get ? h_alias(r, p.seg[2]) : e2b_error(r, 405, "method %s is not allowed on %.256s", m, r->path);
    return true;
  }
  if (p.n == 2 && del) {
    if (strncmp(p.seg[1], "snap-", 5) == 0)
      return false; /* deleteSnapshot: e2b.c */
    h_delete(r, p.seg[1]);
    return true;
  }
  if (p.n == 3 && seg_is(&p, 2, "tags")) {
    get ? h_tags_list(r, p.seg[1]) : e2b_error(r, 405, "method %s is not allowed on %.256s", m, r->path);
    return true;
  }
  if (p.n == 4 && seg_is(&p, 2, "files")) {
    get ? h_file_link(r, p.seg[1], p.seg[3])
        : e2b_error(r, 405, "method %s is not allowed on %.256s", m, r->path);
    return true;
  }
  if (p.n == 5 && seg_is(&p, 2, "builds") && seg_is(&p, 4, "status")) {
    get ? h_status(r, p.seg[1], p.seg[3])
        : e2b_error(r, 405, "method %s is not allowed on %.256s", m, r->path);
    return true;
  }
  return false;
}
