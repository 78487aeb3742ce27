/* test_store_pages.c -- the store's sandbox list in pages: order (created_at_ms, then id) both ways,
 * cursors, total, more, and the filters (org, state, template, metadata) applied before the limit */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "store/store.h"

#include "tap.h"

static char dir[] = "/tmp/moat-test-store-pages-XXXXXX";

static int insert(struct moat_store *s, const char *id, const char *org, int64_t created, const char *tmpl,
                  const char *meta) {
  struct moat_store_sandbox r = {0};
  r.id = (char *)id;
  r.org = (char *)org;
  r.template_name = (char *)tmpl;
  r.state = (char *)"running";
  r.created_at_ms = created;
  r.ttl_seconds = 3600;
  r.metadata_json = (char *)meta;
  r.cpu = 1;
  r.memory_mb = 256;
  r.pids = 64;
  r.disk_mb = 1024;
  r.slot = -1;
  moat_error *err = NULL;
  int rc = moat_store_sandbox_insert(s, &r, "api", &err);
  if (rc < 0) {
    printf("# insert %s: %s\n", id, moat_error_msg(err));
    moat_error_free(&err);
  }
  return rc;
}

/* One page as "id,id,...|total|more"; page's after_id NULL for the first. Caller frees. */
static char *page(struct moat_store *s, const struct moat_store_filter *f, const struct moat_store_page *p) {
  struct moat_store_sandbox *v;
  size_t n, total = 0;
  bool more = false;
  moat_error *err = NULL;
  if (moat_store_sandbox_page(s, f, p, &v, &n, &total, &more, &err) < 0) {
    char *out = xasprintf("error: %s", moat_error_msg(err));
    moat_error_free(&err);
    return out;
  }
  char *out = xstrdup("");
  for (size_t i = 0; i < n; i++) {
    char *next = xasprintf("%s%s%s", out, i ? "," : "", v[i].id);
    free(out);
    out = next;
  }
  char *full = xasprintf("%s|%zu|%s", out, total, more ? "more" : "end");
  free(out);
  moat_store_sandboxes_free(v, n);
  return full;
}

#define EXPECT_PAGE(s, f, p, want, what)                                                                     \
  do {                                                                                                       \
    char *got_ = page(s, f, p);                                                                              \
    CHECK(strcmp(got_, want) == 0, "%s: %s (want %s)", what, got_, want);                                    \
    free(got_);                                                                                              \
  } while (0)

int main(void) {
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  char *path = xasprintf("%s/moat.db", dir);
  moat_error *err = NULL;
  struct moat_store *s = NULL;
  CHECK(moat_store_open(&s, path, &err) == 0, "open: %s", err ? err->msg : "ok");
  free(path);
  if (!s) {
    tap_done();
    return 1;
  }
  /* list order: a (100), then b and c sharing 200 (by id), then d (300); e is another org's */
  CHECK(insert(s, "sb-d", "o1", 300, "base", "{\"k\":\"1\"}") == 0 &&
            insert(s, "sb-c", "o1", 200, "py@v2", "{\"k\":\"2\",\"odd key\\\"\":\"x\"}") == 0 &&
            insert(s, "sb-b", "o1", 200, "py", "{\"k\":\"1\",\"n\":5}") == 0 &&
            insert(s, "sb-a", "o1", 100, "pyx", "{\"k\":\"1\"}") == 0 &&
            insert(s, "sb-e", "o2", 150, "base", "{\"k\":\"1\"}") == 0,
        "insert five sandboxes in two orgs");
  struct moat_store_filter o1 = {.org = "o1"};
  EXPECT_PAGE(s, &o1, NULL, "sb-a,sb-b,sb-c,sb-d|4|end", "unpaged: every one, oldest first, ties by id");
  struct moat_store_page p = {.limit = 2};
  EXPECT_PAGE(s, &o1, &p, "sb-a,sb-b|4|more", "first page of 2");
  p.after_id = "sb-b";
  p.after_created_ms = 200;
  EXPECT_PAGE(s, &o1, &p, "sb-c,sb-d|4|end", "the page after b: the tie at 200 goes on by id");
  p.after_id = "sb-d";
  p.after_created_ms = 300;
  EXPECT_PAGE(s, &o1, &p, "|4|end", "after the last: empty, total still counted");
  p.after_id = "sb-zz"; /* a cursor whose row is gone still places the page */
  p.after_created_ms = 150;
  EXPECT_PAGE(s, &o1, &p, "sb-b,sb-c|4|more", "after a vanished row");
  struct moat_store_page d = {.limit = 3, .desc = true};
  EXPECT_PAGE(s, &o1, &d, "sb-d,sb-c,sb-b|4|more", "descending: newest first, ties by id descending");
  d.after_id = "sb-c";
  d.after_created_ms = 200;
  EXPECT_PAGE(s, &o1, &d, "sb-b,sb-a|4|end", "descending from c");
  struct moat_store_page one = {.limit = 1};
  struct moat_store_filter any = {0};
  EXPECT_PAGE(s, &any, &one, "sb-a|5|more", "every org (NULL): counted across orgs");
  struct moat_store_filter o2 = {.org = "o2"};
  EXPECT_PAGE(s, &o2, NULL, "sb-e|1|end", "another org sees its own only");
  struct moat_store_filter none = {.org = "o3"};
  EXPECT_PAGE(s, &none, &one, "|0|end", "an org with none");

  /* filters apply before the limit */
  json_t *k1 = json_pack("{s:s}", "k", "1");
  struct moat_store_filter fk = {.org = "o1", .metadata = k1};
  EXPECT_PAGE(s, &fk, &one, "sb-a|3|more", "metadata k=1, page of 1");
  p = (struct moat_store_page){.limit = 1, .after_id = "sb-a", .after_created_ms = 100};
  EXPECT_PAGE(s, &fk, &p, "sb-b|3|more", "metadata k=1 after a: c (k=2) is not counted against the limit");
  json_t *odd = json_pack("{s:s, s:s}", "odd key\"", "x", "k", "2");
  struct moat_store_filter fo = {.org = "o1", .metadata = odd};
  EXPECT_PAGE(s, &fo, NULL, "sb-c|1|end", "a key with a space and a quote, two pairs");
  json_t *num = json_pack("{s:s}", "n", "5");
  struct moat_store_filter fn = {.org = "o1", .metadata = num};
  EXPECT_PAGE(s, &fn, NULL, "|0|end", "a number in the metadata does not match its text");
  struct moat_store_filter ft = {.org = "o1", .template_name = "py"};
  EXPECT_PAGE(s, &ft, NULL, "sb-b,sb-c|2|end", "template py: py and py@v2, not pyx");
  struct moat_store_filter fs = {.org = "o1", .state = "paused"};
  EXPECT_PAGE(s, &fs, NULL, "|0|end", "state paused: none");
  CHECK(moat_store_sandbox_transition(s, "sb-b", NULL, "killed", "api", &err) == 0, "kill b");
  EXPECT_PAGE(s, &o1, NULL, "sb-a,sb-c,sb-d|3|end", "killed: not listed by default");
  struct moat_store_filter fkill = {.org = "o1", .state = "killed"};
  EXPECT_PAGE(s, &fkill, &one, "sb-b|1|end", "state killed lists it");
  json_decref(k1);
  json_decref(odd);
  json_decref(num);

  moat_store_close(s);
  moat_error_free(&err);
  rm_rf(dir, NULL);
  return tap_done();
}
