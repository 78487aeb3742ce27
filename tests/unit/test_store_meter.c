/* test_store_meter.c -- the store's metering: samples with running totals, usage over a range as a
 * difference of totals (ends inside and outside the samples' retention) and per time bucket, hourly
 * totals, org scoping, history series, org totals and pruning */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/util.h"
#include "store/store.h"

#include "tap.h"

#define HOUR 3600000LL

static char dir[] = "/tmp/moat-test-store-meter-XXXXXX";
static char db_path[256];

/* n samples of id every 10 s from t0: 1 CPU-second and 0.5 GiB-s per sample, 10 s alive. */
static int add(struct moat_store *s, const char *id, const char *org, int64_t t0, int n, int first) {
  struct moat_store_meter_sample *v = xcalloc((size_t)n, sizeof(*v));
  for (int i = 0; i < n; i++) {
    int k = first + i + 1;
    v[i] = (struct moat_store_meter_sample){.sandbox_id = (char *)id,
                                            .org = (char *)org,
                                            .at_ms = t0 + (int64_t)i * 10000,
                                            .slot = 3,
                                            .cpu_counter_ns = (uint64_t)k * 1000000000ULL,
                                            .cpu_ns = (uint64_t)k * 1000000000ULL,
                                            .mem_gib_s = k * 0.5,
                                            .alive_ms = k * 10000LL,
                                            .cpu_pct = 10,
                                            .cpu_count = 1,
                                            .mem_used = 1 << 20,
                                            .mem_limit = 1 << 30,
                                            .disk_used = -1,
                                            .disk_total = -1,
                                            .net_rx = 5,
                                            .net_tx = -1};
  }
  moat_error *err = NULL;
  int rc = moat_store_meter_add(s, v, (size_t)n, &err);
  moat_error_free(&err);
  free(v);
  return rc;
}

static const struct moat_store_meter_use *find(const struct moat_store_meter_use *u, size_t n,
                                               const char *id) {
  for (size_t i = 0; i < n; i++)
    if (strcmp(u[i].sandbox_id, id) == 0)
      return &u[i];
  return NULL;
}

int main(void) {
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  snprintf(db_path, sizeof(db_path), "%s/moat.db", dir);
  moat_error *err = NULL;
  struct moat_store *s = NULL;
  CHECK(moat_store_open(&s, db_path, &err) == 0, "open a new store");
  if (!s)
    return tap_done();
  int64_t h0 = (now_unix_ms() / HOUR - 5) * HOUR; /* five hours ago, on the hour */
  /* sb-a: 3 hours of samples (1080); sb-b: 10 samples; sb-c of another org */
  CHECK(add(s, "sb-a", "org1", h0, 1080, 0) == 0, "record 1080 samples");
  CHECK(add(s, "sb-b", "org1", h0 + HOUR + 5000, 10, 0) == 0, "record 10 samples of another sandbox");
  CHECK(add(s, "sb-c", "org2", h0, 100, 0) == 0, "record another org's");

  struct moat_store_meter_use *u = NULL;
  size_t n = 0;
  CHECK(moat_store_meter_usage(s, "org1", h0 - HOUR, h0 + 4 * HOUR, &u, &n, &err) == 0 && n == 2,
        "the range holds org1's two sandboxes (%zu)", n);
  const struct moat_store_meter_use *a = find(u, n, "sb-a"), *b = find(u, n, "sb-b");
  CHECK(a && a->cpu_ns == 1080ULL * 1000000000ULL && a->alive_ms == 1080LL * 10000,
        "sb-a: all of it (%llu ns)", a ? (unsigned long long)a->cpu_ns : 0ULL);
  CHECK(b && b->cpu_ns == 10ULL * 1000000000ULL && b->mem_gib_s == 5.0, "sb-b: all of it");
  CHECK(!find(u, n, "sb-c"), "org2's sandbox is not org1's use");
  moat_store_meter_uses_free(u, n);

  /* [h0 + 1h + 15 s, h0 + 2h + 25 s): sb-a's last sample before to is #722 (total 723 s), before
   * from #361 (total 362 s) */
  int64_t from = h0 + HOUR + 15000, to = h0 + 2 * HOUR + 25000;
  CHECK(moat_store_meter_usage(s, "org1", from, to, &u, &n, &err) == 0, "a range with ends inside hours");
  a = find(u, n, "sb-a");
  CHECK(a && a->cpu_ns == 361ULL * 1000000000ULL && a->alive_ms == 3610000,
        "sb-a over the range: its totals' difference (%llu)", a ? (unsigned long long)a->cpu_ns : 0ULL);
  moat_store_meter_uses_free(u, n);

  /* per 10 min bucket over the same range: aligned to multiples of 10 min; the first and last
   * clipped to the range (58 and 3 samples), five whole buckets of 60 between */
  CHECK(moat_store_meter_usage_series(s, "org1", from, to, 600000, &u, &n, &err) == 0, "series per 10 min");
  a = find(u, n, "sb-a");
  bool ok = a && a->n_buckets == 7 && a->cpu_ns == 361ULL * 1000000000ULL;
  uint64_t sum = 0;
  int64_t alive = 0;
  for (size_t i = 0; ok && i < a->n_buckets; i++) {
    uint64_t want = i == 0 ? 58 : i == 6 ? 3 : 60;
    ok = a->buckets[i].start_ms == h0 + HOUR + (int64_t)i * 600000 &&
         a->buckets[i].cpu_ns == want * 1000000000ULL && a->buckets[i].alive_ms == (int64_t)want * 10000 &&
         a->buckets[i].mem_gib_s == want * 0.5;
    sum += a->buckets[i].cpu_ns;
    alive += a->buckets[i].alive_ms;
  }
  CHECK(ok && sum == a->cpu_ns && alive == a->alive_ms,
        "sb-a: seven aligned buckets, clipped at the ends, summing to its totals (%zu buckets)",
        a ? a->n_buckets : 0);
  b = find(u, n, "sb-b");
  CHECK(b && b->n_buckets == 1 && b->buckets[0].start_ms == h0 + HOUR &&
            b->buckets[0].cpu_ns == 9ULL * 1000000000ULL && b->cpu_ns == b->buckets[0].cpu_ns,
        "sb-b: only the bucket it ran in (its buckets without use left out)");
  moat_store_meter_uses_free(u, n);
  CHECK(moat_store_meter_usage_series(s, "org1", h0 - HOUR, h0 + 4 * HOUR, 86400000, &u, &n, &err) == 0,
        "series per day");
  a = find(u, n, "sb-a");
  ok = a && a->n_buckets >= 1 && a->n_buckets <= 2;
  sum = 0;
  for (size_t i = 0; ok && i < a->n_buckets; i++) {
    ok = a->buckets[i].start_ms % 86400000 == 0 &&
         (i == 0 || a->buckets[i].start_ms > a->buckets[i - 1].start_ms);
    sum += a->buckets[i].cpu_ns;
  }
  CHECK(ok && sum == 1080ULL * 1000000000ULL, "per day: buckets from midnight UTC, summing to the total");
  moat_store_meter_uses_free(u, n);
  CHECK(moat_store_meter_usage_series(s, "org1", from, to, 0, &u, &n, &err) < 0 && err &&
            err->status == EINVAL,
        "series: a bucket of 0 is refused");
  moat_error_free(&err);

  struct moat_store_meter_sample *v = NULL;
  CHECK(moat_store_meter_series(s, "org1", "sb-b", 0, INT64_MAX, 4, &v, &n, &err) == 0 && n == 4 &&
            v[0].at_ms == h0 + HOUR + 5000 && v[3].at_ms == h0 + HOUR + 35000 && v[0].net_rx == 5 &&
            v[0].net_tx == -1 && v[0].disk_used == -1,
        "series: oldest first, limited, unknown gauges kept as unknown");
  moat_store_meter_samples_free(v, n);
  CHECK(moat_store_meter_series(s, "org2", "sb-b", 0, INT64_MAX, 100, &v, &n, &err) == 0 && n == 0,
        "series: another org's sandbox has none for it");
  moat_store_meter_samples_free(v, n);

  struct moat_store_meter_sample last;
  CHECK(moat_store_meter_last(s, "sb-a", &last, &err) == 0 &&
            last.cpu_counter_ns == 1080ULL * 1000000000ULL && last.slot == 3,
        "last: the latest sample with its counter and slot");
  free(last.sandbox_id);
  free(last.org);
  CHECK(moat_store_meter_last(s, "sb-none", &last, &err) < 0 && err && err->status == ENOENT, "last: ENOENT");
  moat_error_free(&err);

  struct moat_store_meter_org *o = NULL;
  CHECK(moat_store_meter_org_totals(s, &o, &n, &err) == 0 && n == 2, "org totals: two orgs");
  for (size_t i = 0; i < n; i++) {
    if (strcmp(o[i].org, "org1") == 0)
      CHECK(o[i].cpu_ns == 1090ULL * 1000000000ULL, "org1's CPU: both sandboxes' totals");
    free(o[i].org);
  }
  free(o);

  /* samples pruned: the hourly totals stand in, the range's ends rounded down to the hour (the
   * totals at the last samples of hours h0 and h0+1h: 360 and 720) */
  int pruned = moat_store_meter_prune(s, h0 + 3 * HOUR, 0, &err);
  CHECK(pruned == 1080 + 10 + 100, "prune: every sample older than the cut (%d)", pruned);
  CHECK(moat_store_meter_usage(s, "org1", h0 + HOUR + 15000, h0 + 2 * HOUR + 25000, &u, &n, &err) == 0,
        "usage after pruning");
  a = find(u, n, "sb-a");
  CHECK(a && a->cpu_ns == 360ULL * 1000000000ULL,
        "sb-a: the hour [h0+1h, h0+2h) from the hourly totals (%llu)",
        a ? (unsigned long long)a->cpu_ns : 0ULL);
  moat_store_meter_uses_free(u, n);
  /* per bucket after pruning: the hour's totals stand for its last ms, so the hour's use lands in
   * the bucket that holds the hour's end */
  CHECK(moat_store_meter_usage_series(s, "org1", h0 + HOUR + 15000, h0 + 2 * HOUR + 25000, 600000, &u, &n,
                                      &err) == 0,
        "series after pruning");
  a = find(u, n, "sb-a");
  CHECK(a && a->n_buckets == 1 && a->buckets[0].start_ms == h0 + HOUR + 3000000 &&
            a->buckets[0].cpu_ns == 360ULL * 1000000000ULL && a->buckets[0].cpu_ns == a->cpu_ns,
        "sb-a: the hour's use in the hour's last bucket (%zu buckets)", a ? a->n_buckets : 0);
  moat_store_meter_uses_free(u, n);

  moat_store_close(s);
  moat_error_free(&err);
  rm_rf(dir, NULL);
  return tap_done();
}
