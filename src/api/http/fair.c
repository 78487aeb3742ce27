/* fair.c -- caps per org and per sandbox on requests in flight and streams open
 *
 * Counters live in two hash tables under the api_fair's lock: orgs (kept for the api_fair's
 * lifetime: there are as many as API keys were made, and their entries are the tags the gate groups
 * connections by) and sandboxes (an entry exists while it holds a ticket). The lock is a leaf: no
 * other lock is taken, no call made under it.
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

struct api_fair {
  pthread_mutex_t lock; /* guards the rest */
  struct org_entry *orgs[ORG_BUCKETS];
  struct sb_entry *sbs[SB_BUCKETS];
  struct api_fair_config cfg;
};

struct api_ticket {
  struct api_fair *f;
  struct org_entry *org;
  struct sb_entry *sb; /* NULL: the request names no sandbox */
  bool stream;
};

struct api_fair *api_fair_new(const struct api_fair_config *cfg) {
  struct api_fair *f = xcalloc(1, sizeof(*f));
  pthread_mutex_init(&f->lock, NULL);
  f->cfg = *cfg;
  return f;
}

void api_fair_free(struct api_fair *f) {
  if (!f)
    return;
  for (size_t b = 0; b < ORG_BUCKETS; b++)
    while (f->orgs[b]) {
      struct org_entry *e = f->orgs[b];
      f->orgs[b] = e->next;
      free(e);
    }
  for (size_t b = 0; b < SB_BUCKETS; b++)
    while (f->sbs[b]) {
      struct sb_entry *e = f->sbs[b];
      f->sbs[b] = e->next;
      free(e);
    }
  pthread_mutex_destroy(&f->lock);
  free(f);
}

static uint32_t hash(const char *s) {
  uint32_t h = 2166136261u;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  return h;
}

static struct org_entry *org_get_locked(struct api_fair *f, const char *name) {
  struct org_entry **b = &f->orgs[hash(name) % ORG_BUCKETS];
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

static struct sb_entry *sb_get_locked(struct api_fair *f, const char *id) {
  struct sb_entry **b = &f->sbs[hash(id) % SB_BUCKETS];
  for (struct sb_entry *e = *b; e; e = e->next)
    if (strcmp(e->id, id) == 0)
      return e;
  struct sb_entry *e = xcalloc(1, sizeof(*e));
  snprintf(e->id, sizeof(e->id), "%s", id);
  e->next = *b;
  *b = e;
  return e;
}

static void sb_put_locked(struct api_fair *f, struct sb_entry *e) {
  if (!e || e->n.requests || e->n.streams)
    return;
  struct sb_entry **p = &f->sbs[hash(e->id) % SB_BUCKETS];
  while (*p && *p != e)
    p = &(*p)->next;
  if (*p)
    *p = e->next;
  free(e);
}

/* 0 when org (and sb) can take one more of the kind, else -1 with *err naming the cap. */
static int check_locked(const struct api_fair *f, const struct org_entry *org, const struct sb_entry *sb,
                        bool stream, moat_error **err) {
  if (sb) {
    unsigned have = stream ? sb->n.streams : sb->n.requests;
    unsigned cap = stream ? f->cfg.streams_per_sandbox : f->cfg.requests_per_sandbox;
    if (have >= cap)
      return moat_error_set(err, API_E_TOO_MANY,
                            "sandbox %s has %u %s, its limit (moatd --max-%s-per-sandbox %u); "
                            "retry when one ends",
                            sb->id, have, stream ? "streams open" : "requests in flight",
                            stream ? "streams" : "requests", cap);
  }
  unsigned have = stream ? org->n.streams : org->n.requests;
  unsigned cap = stream ? f->cfg.streams_per_org : f->cfg.requests_per_org;
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

struct api_ticket *api_fair_admit(struct api_fair *f, const char *org, const char *sandbox, bool stream,
                                  moat_error **err) {
  pthread_mutex_lock(&f->lock);
  struct org_entry *o = org_get_locked(f, org ? org : "");
  struct sb_entry *sb = sandbox && *sandbox ? sb_get_locked(f, sandbox) : NULL;
  if (check_locked(f, o, sb, stream, err) < 0) {
    sb_put_locked(f, sb);
    pthread_mutex_unlock(&f->lock);
    return NULL;
  }
  add_locked(&o->n, stream, 1);
  if (sb)
    add_locked(&sb->n, stream, 1);
  pthread_mutex_unlock(&f->lock);
  struct api_ticket *t = xcalloc(1, sizeof(*t));
  t->f = f;
  t->org = o;
  t->sb = sb;
  t->stream = stream;
  return t;
}

int api_fair_to_stream(struct api_ticket *t, moat_error **err) {
  if (!t || t->stream)
    return 0;
  struct api_fair *f = t->f;
  pthread_mutex_lock(&f->lock);
  if (check_locked(f, t->org, t->sb, true, err) < 0) {
    pthread_mutex_unlock(&f->lock);
    return -1;
  }
  add_locked(&t->org->n, false, -1);
  add_locked(&t->org->n, true, 1);
  if (t->sb) {
    add_locked(&t->sb->n, false, -1);
    add_locked(&t->sb->n, true, 1);
  }
  t->stream = true;
  pthread_mutex_unlock(&f->lock);
  return 0;
}

void api_fair_release(struct api_ticket *t) {
  if (!t)
    return;
  struct api_fair *f = t->f;
  pthread_mutex_lock(&f->lock);
  add_locked(&t->org->n, t->stream, -1);
  if (t->sb) {
    add_locked(&t->sb->n, t->stream, -1);
    sb_put_locked(f, t->sb);
  }
  pthread_mutex_unlock(&f->lock);
  free(t);
}

const void *api_fair_org(const struct api_ticket *t) { return t ? t->org : NULL; }
