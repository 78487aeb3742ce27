/* metrics.c -- GET /healthz, GET /v1/sandboxes/{id}/metrics (JSON) and GET /metrics (Prometheus
 * text format 0.0.4). The CPU percent is control's (control/cpu.c: the share of the sandbox's CPU
 * limit over a window that ends now). */
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <microhttpd.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../../common/buf.h"
#include "../../common/util.h"
#include "v1.h"

#define PROM_MAX_SANDBOXES 1000 /* per-sandbox series in GET /metrics */

/* x >= 0 rounded to `scale` (100: two decimals); libm is not linked. */
static double round_to(double x, double scale) { return (double)(long long)(x * scale + 0.5) / scale; }

/* Network bytes of the sandbox: fills in/out and returns true when its network reports them. */
static bool net_bytes(struct api_req *r, const char *id, uint64_t *in, uint64_t *out) {
  moat_error *err = NULL;
  json_t *j = moat_control_network_get(api_control(r), r->org, id, &err);
  moat_error_free(&err);
  if (!j)
    return false;
  json_t *bi = json_object_get(j, "bytes_in"), *bo = json_object_get(j, "bytes_out");
  bool ok = json_is_integer(bi) && json_is_integer(bo);
  if (ok) {
    *in = (uint64_t)json_integer_value(bi);
    *out = (uint64_t)json_integer_value(bo);
  }
  json_decref(j);
  return ok;
}

/* ---- GET /v1/sandboxes/{id}/metrics ---- */

int api_h_sandbox_metrics(struct api_req *r, json_t *body) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_arg_get(&r->args, "from") || api_arg_get(&r->args, "to") || api_arg_get(&r->args, "limit"))
    return api_sandbox_metrics_series(r); /* the history; without them: the sample of now */
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_sandbox_usage u;
  struct moat_cpu_pct pct;
  if (moat_control_usage_cpu(api_control(r), r->org, r->route.id, &u, &pct, &err) < 0)
    return api_reply_moat_error(r, &err);
  uint64_t bin = 0, bout = 0;
  bool has_net = net_bytes(r, r->route.id, &bin, &bout);
  json_t *disk = u.has_disk ? json_pack("{s:I, s:I}", "used_bytes", (json_int_t)u.disk_used_bytes,
                                        "total_bytes", (json_int_t)u.disk_total_bytes)
                            : json_null();
  json_t *net = has_net ? json_pack("{s:I, s:I}", "bytes_in", (json_int_t)bin, "bytes_out", (json_int_t)bout)
                        : json_null();
  json_t *cpu =
      json_pack("{s:I, s:f, s:f, s:f}", "usage_ns", (json_int_t)u.u.cpu_usage_ns, "limit", u.limits.cpu,
                "used_pct", round_to(pct.pct, 100), "window_ms", round_to(pct.window_ms, 10));
  json_t *mem = json_pack("{s:I, s:I}", "used_bytes", (json_int_t)u.u.memory_bytes, "limit_bytes",
                          (json_int_t)(u.limits.memory_mb << 20));
  json_t *pids = json_pack("{s:I, s:I}", "current", (json_int_t)u.u.pids, "limit", (json_int_t)u.limits.pids);
  return api_reply_json(r, 200,
                        json_pack("{s:s, s:s, s:o, s:b, s:o, s:o, s:o, s:I, s:o, s:o}", "sandbox_id", u.id,
                                  "state", moat_sandbox_state_name(u.state), "timestamp",
                                  api_time_json(u.at_ms, false), "sampled", u.sampled, "cpu", cpu, "memory",
                                  mem, "pids", pids, "oom_kills", (json_int_t)u.u.oom_kills, "disk", disk,
                                  "network", net));
}

/* ---- GET /metrics ---- */

static void buf_str(struct moat_buf *b, const char *s) { moat_buf_append(b, s, strlen(s)); }

static void buf_printf(struct moat_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void buf_printf(struct moat_buf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof(tmp), fmt, ap);
  va_end(ap);
  if (n > 0)
    moat_buf_append(b, tmp, (size_t)n < sizeof(tmp) ? (size_t)n : sizeof(tmp) - 1);
}

/* A label value escaped per the text format: backslash, double quote and newline. */
static void label_value(struct moat_buf *b, const char *s) {
  for (; *s; s++) {
    if (*s == '\\')
      buf_str(b, "\\\\");
    else if (*s == '"')
      buf_str(b, "\\\"");
    else if (*s == '\n')
      buf_str(b, "\\n");
    else
      moat_buf_append(b, s, 1);
  }
}

/* {available, criu}: whether checkpoints work here and which CRIU (healthz, host). */
static json_t *checkpoints_json(struct moat_control *c) {
  return json_pack("{s:b, s:s}", "available", c && moat_control_can_checkpoint(c), "criu",
                   c ? moat_control_criu_status(c) : "unknown");
}

int api_h_healthz(struct api_req *r, json_t *body) {
  struct moat_control *c = api_control(r);
  json_t *ck = checkpoints_json(c);
  json_t *net =
      c ? moat_control_network_status(c) : json_pack("{s:b, s:s}", "internet", false, "uplink", "none");
  return api_reply_json(r, 200,
                        json_pack("{s:s, s:s, s:o, s:o}", "status", "ok", "version", api_version(r),
                                  "checkpoints", ck, "network", net));
}

/* GET /v1/host: the host's capacity, checkpoints and network for every key; its load and what every
 * org's sandboxes hold of it for the platform admin's key only (an org's key sees its own sandboxes:
 * how busy the host is tells it of other tenants). */
int api_h_host(struct api_req *r, json_t *body) {
  (void)body;
  if (api_args_none(r) < 0)
    return -1;
  struct moat_control *c = api_control(r);
  bool platform = r->key.role == MOAT_ROLE_PLATFORM;
  struct moat_host_info hi;
  moat_control_host_info(c, platform ? NULL : r->org, &hi);
  json_t *states = json_object();
  uint64_t live = 0;
  for (int s = MOAT_SB_CREATING; s < MOAT_SB_KILLED; s++) {
    json_object_set_new(states, moat_sandbox_state_name((enum moat_sandbox_state)s),
                        json_integer((json_int_t)hi.by_state[s]));
    live += hi.by_state[s];
  }
  json_t *load = json_null();
  if (platform)
    load = json_pack("{s:[f,f,f], s:I, s:I, s:I}", "average", hi.cap.load[0], hi.cap.load[1], hi.cap.load[2],
                     "memory_available_mb", (json_int_t)hi.cap.memory_available_mb, "disk_free_mb",
                     (json_int_t)hi.cap.disk_free_mb, "uptime_seconds", (json_int_t)hi.cap.uptime_s);
  json_t *ck = checkpoints_json(c);
  json_t *o = json_pack("{s:s, s:s, s:{s:I, s:I, s:I, s:I}, s:o, s:{s:I, s:o, s:f, s:I}, s:o, s:o}",
                        "version", api_version(r), "scope", platform ? "host" : "org", "capacity", "cpus",
                        (json_int_t)hi.cap.cpus, "memory_mb", (json_int_t)hi.cap.memory_mb, "disk_mb",
                        (json_int_t)hi.cap.disk_mb, "pids_max", (json_int_t)hi.cap.pid_max, "load", load,
                        "sandboxes", "live", (json_int_t)live, "by_state", states, "committed_vcpus",
                        hi.committed_vcpus, "committed_memory_mb", (json_int_t)hi.committed_memory_mb,
                        "checkpoints", ck, "network", moat_control_network_status(c));
  return api_reply_json(r, 200, o);
}

static void family(struct moat_buf *b, const char *name, const char *type, const char *help) {
  buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

static void sandbox_sample(struct moat_buf *b, const char *name, const struct moat_sandbox_usage *u,
                           double v) {
  buf_printf(b, "%s{sandbox=\"%s\",org=\"", name, u->id);
  label_value(b, u->org);
  buf_printf(b, "\"} %.17g\n", v);
}

static uint64_t self_rss_bytes(void) {
  FILE *f = fopen("/proc/self/statm", "re");
  unsigned long long size = 0, res = 0;
  if (f) {
    if (fscanf(f, "%llu %llu", &size, &res) != 2)
      res = 0;
    fclose(f);
  }
  return (uint64_t)res * (uint64_t)sysconf(_SC_PAGESIZE);
}

static uint64_t self_open_fds(void) {
  _cleanup_dir_ DIR *d = opendir("/proc/self/fd");
  uint64_t n = 0;
  if (!d)
    return 0;
  struct dirent *de;
  while ((de = readdir(d)) != NULL)
    n += de->d_name[0] != '.';
  return n > 0 ? n - 1 : 0; /* not the directory's own fd */
}

/* The databases' families: states over every org, each of org's databases' open connections, and
 * moatd's connection and wake counters with the wake times' histogram. */
static void database_families(struct moat_control *c, const char *org, struct moat_buf *b) {
  static const char *const states[] = {"creating", "running", "paused",  "hibernated",
                                       "stopped",  "failed",  "deleting"};
  size_t n_states = sizeof(states) / sizeof(states[0]);
  uint64_t by_state[sizeof(states) / sizeof(states[0])] = {0};
  struct moat_database_info *v = NULL;
  size_t n = 0;
  moat_error *err = NULL;
  if (moat_control_database_list(c, NULL, &v, &n, &err) < 0)
    moat_error_free(&err);
  for (size_t i = 0; i < n; i++)
    for (size_t s = 0; s < n_states; s++)
      by_state[s] += strcmp(v[i].state, states[s]) == 0;
  family(b, "moat_databases", "gauge", "Databases by state, every org.");
  for (size_t s = 0; s < n_states; s++)
    buf_printf(b, "moat_databases{state=\"%s\"} %llu\n", states[s], (unsigned long long)by_state[s]);
  family(b, "moat_database_connections", "gauge", "Open client connections of the database (caller's org).");
  for (size_t i = 0; i < n; i++)
    if (strcmp(v[i].org, org) == 0)
      buf_printf(b, "moat_database_connections{database=\"%s\",name=\"%s\",state=\"%s\"} %d\n", v[i].id,
                 v[i].name, v[i].state, v[i].connections);
  moat_database_infos_free(v, n);
  struct moat_database_stats st;
  moat_control_database_stats(c, &st);
  family(b, "moat_database_connections_total", "counter", "Client connections the PostgreSQL proxy routed.");
  buf_printf(b, "moat_database_connections_total %llu\n", (unsigned long long)st.connections_total);
  family(b, "moat_database_wakes_total", "counter", "Connections that had to wake or restart their server.");
  buf_printf(b, "moat_database_wakes_total %llu\n", (unsigned long long)st.wakes_total);
  family(b, "moat_database_wake_seconds", "histogram",
         "Time from a connection to its woken server's answer.");
  for (size_t i = 0; i < MOAT_DB_WAKE_BUCKETS; i++)
    buf_printf(b, "moat_database_wake_seconds_bucket{le=\"%g\"} %llu\n", moat_db_wake_bounds[i],
               (unsigned long long)st.wake_le[i]);
  buf_printf(b, "moat_database_wake_seconds_bucket{le=\"+Inf\"} %llu\n", (unsigned long long)st.wakes_total);
  buf_printf(b, "moat_database_wake_seconds_sum %.6f\n", st.wake_sum_s);
  buf_printf(b, "moat_database_wake_seconds_count %llu\n", (unsigned long long)st.wakes_total);
}

/* moat_org_quota_use / moat_org_quota_limit {org, quota} of org (a limit only where one is set). */
static void org_quota_samples(struct moat_control *c, const char *org, struct moat_buf *use,
                              struct moat_buf *lim) {
  struct moat_quotas q;
  int64_t u[MOAT_Q_N];
  moat_error *err = NULL;
  if (moat_control_org_usage(c, org, &q, u, &err) < 0) {
    moat_error_free(&err);
    return;
  }
  for (int i = 0; i < MOAT_Q_N; i++) {
    buf_str(use, "moat_org_quota_use{org=\"");
    label_value(use, org);
    buf_printf(use, "\",quota=\"%s\"} %lld\n", moat_quota_name((enum moat_quota)i), (long long)u[i]);
    if (q.v[i] < 0)
      continue;
    buf_str(lim, "moat_org_quota_limit{org=\"");
    label_value(lim, org);
    buf_printf(lim, "\",quota=\"%s\"} %lld\n", moat_quota_name((enum moat_quota)i), (long long)q.v[i]);
  }
}

/* The quota families: every org's for the platform admin key, else the caller's org's. */
static void quota_families(struct moat_control *c, const struct api_req *r, struct moat_buf *b) {
  struct moat_buf use = {0}, lim = {0};
  if (r->key.role == MOAT_ROLE_PLATFORM) {
    struct moat_org_info *v = NULL;
    size_t n = 0;
    moat_error *err = NULL;
    if (moat_control_org_list(c, NULL, 1000, &v, &n, &err) < 0)
      moat_error_free(&err);
    for (size_t i = 0; i < n; i++)
      org_quota_samples(c, v[i].id, &use, &lim);
    moat_org_infos_free(v, n);
  } else {
    org_quota_samples(c, r->org, &use, &lim);
  }
  family(b, "moat_org_quota_use", "gauge", "An org's use against each of its quotas now.");
  moat_buf_append(b, use.p ? use.p : "", use.len);
  family(b, "moat_org_quota_limit", "gauge", "An org's quotas (absent: unlimited).");
  moat_buf_append(b, lim.p ? lim.p : "", lim.len);
  free(use.p);
  free(lim.p);
}

static int reply_text(struct api_req *r, struct moat_buf *b) {
  struct MHD_Response *resp = MHD_create_response_from_buffer(b->len, b->p, MHD_RESPMEM_MUST_FREE);
  if (!resp) {
    free(b->p);
    return -1;
  }
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8");
  int ret = api_reply_response(r, 200, resp);
  MHD_destroy_response(resp);
  return ret;
}

int api_h_metrics(struct api_req *r, json_t *body) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_control *c = api_control(r);
  if (r->key.role == MOAT_ROLE_PLATFORM) { /* the orgs' quotas, nothing of a tenant's */
    struct moat_buf pb = {0};
    quota_families(c, r, &pb);
    return reply_text(r, &pb);
  }
  struct moat_control_stats st;
  if (moat_control_stats(c, &st, &err) < 0)
    return api_reply_moat_error(r, &err);
  struct moat_sandbox_usage *v = NULL;
  size_t n = 0;
  if (moat_control_usage_list(c, r->org, PROM_MAX_SANDBOXES, &v, &n, &err) < 0)
    return api_reply_moat_error(r, &err);

  struct moat_buf b = {0};
  family(&b, "moat_sandboxes", "gauge", "Sandboxes recorded by state, every org.");
  for (int s = MOAT_SB_CREATING; s <= MOAT_SB_KILLED; s++)
    buf_printf(&b, "moat_sandboxes{state=\"%s\"} %llu\n", moat_sandbox_state_name((enum moat_sandbox_state)s),
               (unsigned long long)st.by_state[s]);
  family(&b, "moat_sandboxes_created_total", "counter",
         "Sandboxes ever created in this data dir, every org.");
  buf_printf(&b, "moat_sandboxes_created_total %llu\n", (unsigned long long)st.created_total);
  family(&b, "moat_sandbox_create_seconds", "histogram",
         "Server-side create-to-ready time of recorded sandboxes.");
  for (size_t i = 0; i < MOAT_LATENCY_BUCKETS; i++)
    buf_printf(&b, "moat_sandbox_create_seconds_bucket{le=\"%g\"} %llu\n", moat_create_latency_bounds[i],
               (unsigned long long)st.latency_le[i]);
  buf_printf(&b, "moat_sandbox_create_seconds_bucket{le=\"+Inf\"} %llu\n",
             (unsigned long long)st.latency_count);
  buf_printf(&b, "moat_sandbox_create_seconds_sum %.6f\n", st.latency_sum_s);
  buf_printf(&b, "moat_sandbox_create_seconds_count %llu\n", (unsigned long long)st.latency_count);

  family(&b, "moat_sandbox_cpu_seconds_total", "counter", "CPU time used by the sandbox (caller's org).");
  for (size_t i = 0; i < n; i++)
    if (v[i].sampled)
      sandbox_sample(&b, "moat_sandbox_cpu_seconds_total", &v[i], (double)v[i].u.cpu_usage_ns / 1e9);
  family(&b, "moat_sandbox_cpu_limit", "gauge", "The sandbox's CPU limit in vCPUs (caller's org).");
  for (size_t i = 0; i < n; i++)
    sandbox_sample(&b, "moat_sandbox_cpu_limit", &v[i], v[i].limits.cpu);
  family(&b, "moat_sandbox_memory_bytes", "gauge", "Memory charged to the sandbox's cgroup (caller's org).");
  for (size_t i = 0; i < n; i++)
    sandbox_sample(&b, "moat_sandbox_memory_bytes", &v[i], (double)v[i].u.memory_bytes);
  family(&b, "moat_sandbox_memory_limit_bytes", "gauge", "The sandbox's memory limit (caller's org).");
  for (size_t i = 0; i < n; i++)
    sandbox_sample(&b, "moat_sandbox_memory_limit_bytes", &v[i], (double)(v[i].limits.memory_mb << 20));
  family(&b, "moat_sandbox_pids", "gauge", "Processes in the sandbox (caller's org).");
  for (size_t i = 0; i < n; i++)
    sandbox_sample(&b, "moat_sandbox_pids", &v[i], (double)v[i].u.pids);
  family(&b, "moat_sandbox_oom_kills_total", "counter", "Processes of the sandbox the kernel OOM-killed.");
  for (size_t i = 0; i < n; i++)
    if (v[i].sampled)
      sandbox_sample(&b, "moat_sandbox_oom_kills_total", &v[i], (double)v[i].u.oom_kills);
  free(v);
  double org_cpu, org_mem;
  if (moat_control_meter_org_totals(c, r->org, &org_cpu, &org_mem)) {
    family(&b, "moat_org_cpu_seconds_total", "counter",
           "CPU time metered to the org's sandboxes (caller's org).");
    buf_str(&b, "moat_org_cpu_seconds_total{org=\"");
    label_value(&b, r->org);
    buf_printf(&b, "\"} %.6f\n", org_cpu);
    family(&b, "moat_org_memory_gib_seconds_total", "counter",
           "Working-set memory metered to the org's sandboxes, GiB-seconds (caller's org).");
    buf_str(&b, "moat_org_memory_gib_seconds_total{org=\"");
    label_value(&b, r->org);
    buf_printf(&b, "\"} %.6f\n", org_mem);
  }
  database_families(c, r->org, &b);
  quota_families(c, r, &b);

  family(&b, "moat_process_resident_memory_bytes", "gauge", "moatd's resident set size.");
  buf_printf(&b, "moat_process_resident_memory_bytes %llu\n", (unsigned long long)self_rss_bytes());
  family(&b, "moat_process_open_fds", "gauge", "moatd's open file descriptors.");
  buf_printf(&b, "moat_process_open_fds %llu\n", (unsigned long long)self_open_fds());
  return reply_text(r, &b);
}
