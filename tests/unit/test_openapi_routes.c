/* test_openapi_routes.c -- docs/openapi.yaml and the router agree: every documented operation is a route
 * moatd serves (with the route kind its x-route names, the auth it declares and a JSON body where the router
 * reads one), every method a documented path does not list is refused, and every route kind the router
 * has is documented.
 *
 * docs/openapi.yaml is kept JSON-compatible (JSON is YAML), so jansson reads it here directly: nothing is
 * generated in between that could drift. The path is $MOAT_OPENAPI, else docs/openapi.yaml from the
 * working directory (scripts/unit.sh runs from the repository root), else next to this source file.
 */
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "api/http/http.h"
#include "tap.h"

/* A value that the router accepts for each path parameter; ref gets a pid and, in a second pass, a tag. */
static const char *param_value(const char *name, int pass) {
  if (strcmp(name, "id") == 0)
    return "sb-0123456789abcdefg";
  if (strcmp(name, "ref") == 0)
    return pass == 0 ? "4242" : "my-tag.1";
  if (strcmp(name, "kid") == 0)
    return "key-0123456789abcdef";
  if (strcmp(name, "cid") == 0)
    return "ctx-1";
  if (strcmp(name, "sid") == 0)
    return "snap-0123456789abcdefg";
  if (strcmp(name, "name") == 0)
    return "code-interpreter";
  if (strcmp(name, "port") == 0)
    return "8080";
  if (strcmp(name, "path") == 0)
    return "static/app.js";
  return NULL;
}

/* Fills out with tmpl's {params} replaced. Returns false (and says which) for an unknown parameter. */
static bool expand(const char *tmpl, int pass, char *out, size_t size, bool *has_ref) {
  size_t o = 0;
  *has_ref = false;
  for (const char *p = tmpl; *p;) {
    if (*p == '{') {
      const char *end = strchr(p, '}');
      if (!end)
        return false;
      char name[32];
      size_t n = (size_t)(end - p - 1);
      if (n >= sizeof(name))
        return false;
      memcpy(name, p + 1, n);
      name[n] = '\0';
      const char *v = param_value(name, pass);
      if (!v) {
        OK(false, "%s: no sample value for path parameter {%s}: add one to param_value()", tmpl, name);
        return false;
      }
      if (strcmp(name, "ref") == 0)
        *has_ref = true;
      o += (size_t)snprintf(out + o, size - o, "%s", v);
      p = end + 1;
    } else {
      if (o + 1 < size)
        out[o++] = *p;
      p++;
    }
  }
  out[o < size ? o : size - 1] = '\0';
  return true;
}

static const char *const methods[] = {"get", "put", "post", "delete", "patch", "head", "options", "trace"};

static json_t *load_doc(void) {
  const char *env = getenv("MOAT_OPENAPI");
  char here[4096];
  snprintf(here, sizeof(here), "%s", __FILE__);
  char *slash = strrchr(here, '/');
  if (slash)
    snprintf(slash + 1, sizeof(here) - (size_t)(slash + 1 - here), "../../docs/openapi.yaml");
  const char *tries[] = {env, "docs/openapi.yaml", here};
  for (size_t i = 0; i < ARRAY_SIZE(tries); i++) {
    if (!tries[i])
      continue;
    json_error_t je;
    json_t *doc = json_load_file(tries[i], JSON_REJECT_DUPLICATES, &je);
    if (doc) {
      printf("# %s\n", tries[i]);
      return doc;
    }
    if (strstr(je.text, "unable to open") == NULL) {
      OK(false, "%s is not JSON-compatible YAML: %s (line %d, column %d)", tries[i], je.text, je.line,
         je.column);
      return NULL;
    }
  }
  OK(false, "docs/openapi.yaml not found (set MOAT_OPENAPI)");
  return NULL;
}

/* True when op declares "security": [] (no auth). */
static bool op_public(json_t *op) {
  json_t *sec = json_object_get(op, "security");
  return json_is_array(sec) && json_array_size(sec) == 0;
}

static bool op_json_body(json_t *op) {
  json_t *rb = json_object_get(op, "requestBody");
  return rb && json_object_get(json_object_get(rb, "content"), "application/json");
}

int main(void) {
  json_t *doc = load_doc();
  if (!doc)
    return tap_done();
  json_t *paths = json_object_get(doc, "paths");
  OK(json_is_object(paths) && json_object_size(paths) > 0, "the document has paths");
  /* The routes moatd serves, by name (one name may stand for several methods of one path). */
  struct api_router *rt = api_router_new();
  api_front_ends(rt);
  const char *names[256];
  bool reached[256] = {false};
  size_t n_names = 0;
  for (size_t i = 0; i < api_router_count(rt); i++) {
    const char *nm = api_router_at(rt, i)->name;
    size_t k = 0;
    while (k < n_names && strcmp(names[k], nm) != 0)
      k++;
    if (k == n_names && n_names < ARRAY_SIZE(names))
      names[n_names++] = nm;
  }

  const char *tmpl;
  json_t *item;
  size_t n_ops = 0;
  json_object_foreach(paths, tmpl, item) {
    for (int pass = 0; pass < 2; pass++) {
      char path[512];
      bool has_ref;
      if (!expand(tmpl, pass, path, sizeof(path), &has_ref))
        break;
      if (pass == 1 && !has_ref)
        break;
      for (size_t i = 0; i < ARRAY_SIZE(methods); i++) {
        char up[16];
        size_t k;
        for (k = 0; methods[i][k]; k++)
          up[k] = (char)(methods[i][k] - 'a' + 'A');
        up[k] = '\0';
        json_t *op = json_object_get(item, methods[i]);
        struct api_route r;
        enum api_match m = api_router_match(rt, up, path, &r);
        if (!op) {
          OK(m != API_MATCH_OK, "%s %s is not documented and not served (got %s)", up, path,
             m == API_MATCH_OK ? api_route_name(&r) : "refused");
          continue;
        }
        n_ops += pass == 0;
        const char *want = json_string_value(json_object_get(op, "x-route"));
        if (!OK(m == API_MATCH_OK, "%s %s is served (match %d)", up, path, m))
          continue;
        OK(want && strcmp(api_route_name(&r), want) == 0, "%s %s is route %s (x-route %s)", up, path,
           api_route_name(&r), want ? want : "missing");
        bool needs_auth = !(r.def->flags & API_RT_PUBLIC);
        OK(needs_auth == !op_public(op), "%s %s: auth %s as documented", up, path,
           needs_auth ? "required" : "not required");
        if (r.def->flags & API_RT_JSON)
          OK(op_json_body(op), "%s %s reads a JSON body: the document has an application/json requestBody",
             up, path);
        for (size_t j = 0; j < n_names; j++)
          if (strcmp(names[j], r.def->name) == 0)
            reached[j] = true;
      }
    }
  }
  OK(n_ops >= n_names, "%zu documented operations for %zu routes", n_ops, n_names);
  for (size_t k = 0; k < n_names; k++)
    OK(reached[k], "route %s is documented in docs/openapi.yaml", names[k]);
  api_router_free(rt);
  json_decref(doc);
  return tap_done();
}
