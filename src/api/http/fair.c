/* fair.c -- caps per org and per sandbox on requests in flight and streams open
 *
 * Counters live in two hash tables under one lock: orgs (kept for the process's lifetime: there are
 * as many as API keys were made, and their entries are the tags the gate groups connections by)
 * and sandboxes (an entry exists while it holds a ticket).
 */
#include "fair.h"

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../common/util.h"
#include "http.h"

#define ORG_BUCKETS 64
#define SB_BUCKETS 1024

struct counts {
  unsigned requests, streams;
};

struct org_entry {
  struct org_entry *next;
  struct counts n;
  char name[];
};

struct sb_entry {
  struct sb_entry *next;
  struct counts n;
  char id[MOAT_ID_LEN + 1];
};

struct api_ticket {
  struct org_entry *org;
  struct sb_entry *sb; /* NULL: the request names no sandbox */
  bool stream;
};

static pthread_mutex_t f_lock = PTHREAD_MUTEX_INITIALIZER;
static struct org_entry *f_orgs[ORG_BUCKETS];
static struct sb_entry *f_sbs[SB_BUCKETS];
static struct api_fair_config f_cfg = {
    .requests_per_org = API_DEFAULT_REQUESTS_PER_ORG,
    .streams_per_org = API_DEFAULT_STREAMS_PER_ORG,
    .requests_per_sandbox = API_DEFAULT_REQUESTS_PER_SANDBOX,
    .streams_per_sandbox = API_DEFAULT_STREAMS_PER_SANDBOX,
};

void api_fair_configure(const struct api_fair_config *cfg) {
  pthread_mutex_lock(&f_lock);
  f_cfg = *cfg;
  pthread_mutex_unlock(&f_lock);
}

static uint32_t hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

static struct org_entry *org_get_locked(const char *name) {
  struct org_entry **b = &f_orgs[hash(name) % ORG_BUCKETS];
  for (struct org_entry *e = *b; e; e = e->next)
    if (strcmp(e->name, name) == 0)
      return e;
  size_t n = strlen(name);
  struct org_entry *e = xcalloc(1, sizeof(*e) + n + 1);
  memcpy(e->name, name, n + 1);
  e->next = *b;
  *b = e;
  return e;
}

static struct sb_entry *sb_get_locked(const char *id) {
  struct sb_entry **b = &f_sbs[hash(id) % SB_BUCKETS];
  for (struct sb_entry *e = *b; e; e = e->next)
    if (strcmp(e->id, id) == 0)
      return e;
  struct sb_entry *e = xcalloc(1, sizeof(*e));
  snprintf(e->id, sizeof(e->id), "%s", id);
  e->next = *b;
  *b = e;
  return e;
}

static void sb_put_locked(struct sb_entry *e) {
  if (!e || e->n.requests || e->n.streams)
    return;
  struct sb_entry **p = &f_sbs[hash(e->id) % SB_BUCKETS];
  while (*p && *p != e)
    p = &(*p)->next;
  if (*p)
    *p = e->next;
  free(e);
}

/* 0 when org (and sb) can take one more of the kind, else -1 with *err naming the cap. */
static int check_locked(const struct org_entry *org, const struct sb_entry *sb, bool stream, moat_error **err) {
  if (sb) {
    unsigned have = stream ? sb->n.streams : sb->n.requests;
    unsigned cap = stream ? f_cfg.streams_per_sandbox : f_cfg.requests_per_sandbox;
    if (have >= cap)
      return moat_error_set(err, API_E_TOO_MANY,
                            "sandbox %s has %u %s, its limit (moatd --max-%s-per-sandbox %u); "
                            "retry when one ends",
                            sb->id, have, stream ? "streams open" : "requests in flight",
                            stream ? "streams" : "requests", cap);
  }
  unsigned have = stream ? org->n.streams : org->n.requests;
  unsigned cap = stream ? f_cfg.streams_per_org : f_cfg.requests_per_org;
  if (have >= cap)
    return moat_error_set(err, API_E_TOO_MANY,
                          "org %.64s has %u %s, its limit (moatd --max-%s-per-org %u); "
                          "retry when one ends",
                          org->name, have, stream ? "streams open" : "requests in flight",
                          stream ? "streams" : "requests", cap);
  return 0;
}

static void add_locked(struct counts *c, bool stream, int d) {
  if (stream)
    c->streams += (unsigned)d;
  else
    c->requests += (unsigned)d;
}

struct api_ticket *api_fair_admit(const char *org, const char *sandbox, bool stream, moat_error **err) {
  pthread_mutex_lock(&f_lock);
  struct org_entry *o = org_get_locked(org ? org : "");
  struct sb_entry *sb = sandbox && *sandbox ? sb_get_locked(sandbox) : NULL;
  if (check_locked(o, sb, stream, err) < 0) {
    sb_put_locked(sb);
    pthread_mutex_unlock(&f_lock);
    return NULL;
  }
  add_locked(&o->n, stream, 1);
  if (sb)
    add_locked(&sb->n, stream, 1);
  pthread_mutex_unlock(&f_lock);
  struct api_ticket *t = xcalloc(1, sizeof(*t));
  t->org = o;
  t->sb = sb;
  t->stream = stream;
  return t;
}

int api_fair_to_stream(struct api_ticket *t, moat_error **err) {
  if (!t || t->stream)
    return 0;
  pthread_mutex_lock(&f_lock);
  if (check_locked(t->org, t->sb, true, err) < 0) {
    pthread_mutex_unlock(&f_lock);
    return -1;
  }
  add_locked(&t->org->n, false, -1);
  add_locked(&t->org->n, true, 1);
  if (t->sb) {
    add_locked(&t->sb->n, false, -1);
    add_locked(&t->sb->n, true, 1);
  }
  t->stream = true;
  pthread_mutex_unlock(&f_lock);
  return 0;
}

void api_fair_release(struct api_ticket *t) {
  if (!t)
    return;
  pthread_mutex_lock(&f_lock);
  add_locked(&t->org->n, t->stream, -1);
  if (t->sb) {
    add_locked(&t->sb->n, t->stream, -1);
    sb_put_locked(t->sb);
  }
  pthread_mutex_unlock(&f_lock);
  free(t);
}

const void *api_fair_org(const struct api_ticket *t) { return t ? t->org : NULL; }
