/* args.c -- query arguments: the allowed set, and parsers for the values the front ends take */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "http.h"

const char *api_arg_get(const struct api_args *a, const char *key) {
  for (size_t i = 0; i < a->n; i++)
    if (strcmp(a->v[i].key, key) == 0)
      return a->v[i].value;
  return NULL;
}

int api_args_check(const struct api_args *a, const char *const *allowed, moat_error **err) {
  for (size_t i = 0; i < a->n; i++) {
    const char *k = a->v[i].key;
    bool ok = false;
    for (size_t j = 0; allowed && allowed[j]; j++) {
      size_t n = strlen(allowed[j]);
      if (n > 0 && allowed[j][n - 1] == '.') {
        if (strncmp(k, allowed[j], n) == 0 && k[n] != '\0') {
          ok = true;
          break;
        }
      } else if (strcmp(k, allowed[j]) == 0) {
        ok = true;
        break;
      }
    }
    if (!ok)
      return moat_error_set(err, EINVAL, "unknown query parameter '%.128s'", k);
    for (size_t j = 0; j < i; j++)
      if (strcmp(a->v[j].key, k) == 0)
        return moat_error_set(err, EINVAL, "query parameter '%.128s' given more than once", k);
  }
  return 0;
}

int api_args_none(struct api_req *r) {
  static const char *const none[] = {NULL};
  moat_error *err = NULL;
  if (api_args_check(&r->args, none, &err) < 0)
    return api_reply_moat_error(r, &err), -1;
  return 0;
}

int api_arg_bool(const struct api_args *a, const char *key, bool def, bool *out, moat_error **err) {
  const char *v = api_arg_get(a, key);
  if (!v) {
    *out = def;
    return 0;
  }
  if (strcmp(v, "true") == 0 || strcmp(v, "1") == 0)
    *out = true;
  else if (strcmp(v, "false") == 0 || strcmp(v, "0") == 0)
    *out = false;
  else
    return moat_error_set(err, EINVAL, "query parameter '%s' must be true or false", key);
  return 0;
}

int api_arg_path(const struct api_args *a, const char *key, const char **out, moat_error **err) {
  const char *v = api_arg_get(a, key);
  if (!v)
    return moat_error_set(err, EINVAL, "query parameter '%s' is required", key);
  /* NUL bytes were rejected when the arguments were collected (http.c). */
  if (api_check_path(key, v, strlen(v), err) < 0)
    return -1;
  *out = v;
  return 0;
}

int api_arg_user(const struct api_args *a, const char **out, moat_error **err) {
  const char *v = api_arg_get(a, "user");
  *out = NULL;
  if (!v)
    return 0;
  if (api_check_user("user", v, err) < 0)
    return -1;
  *out = v;
  return 0;
}

int api_arg_depth(const struct api_args *a, uint32_t *out, moat_error **err) {
  const char *v = api_arg_get(a, "depth");
  uint64_t d;
  if (!v) {
    *out = 1;
    return 0;
  }
  if (parse_u64(v, &d) < 0 || d < 1 || d > API_MAX_DEPTH)
    return moat_error_set(err, EINVAL, "query parameter 'depth' must be an integer from 1 to %d",
                          API_MAX_DEPTH);
  *out = (uint32_t)d;
  return 0;
}

int api_arg_mode(const struct api_args *a, uint32_t *out, moat_error **err) {
  const char *v = api_arg_get(a, "mode");
  if (!v) {
    *out = 0; /* the guest's default */
    return 0;
  }
  size_t n = strlen(v);
  uint32_t m = 0;
  if (n == 0 || n > 5)
    goto bad;
  for (size_t i = 0; i < n; i++) {
    if (v[i] < '0' || v[i] > '7')
      goto bad;
    m = m * 8 + (uint32_t)(v[i] - '0');
  }
  if (m > 07777)
    goto bad;
  *out = m;
  return 0;
bad:
  return moat_error_set(err, EINVAL, "query parameter 'mode' must be an octal mode from 0 to 07777");
}

int api_signal_parse(const char *name) {
  static const struct {
    const char *name;
    int sig;
  } sigs[] = {{"TERM", SIGTERM}, {"KILL", SIGKILL}, {"INT", SIGINT},   {"HUP", SIGHUP},  {"QUIT", SIGQUIT},
              {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"STOP", SIGSTOP}, {"CONT", SIGCONT}};
  if (strncmp(name, "SIG", 3) == 0)
    name += 3;
  for (size_t i = 0; i < ARRAY_SIZE(sigs); i++)
    if (strcmp(name, sigs[i].name) == 0)
      return sigs[i].sig;
  return 0;
}

/* A time: RFC 3339 ("2026-01-02T03:04:05.678Z", "+01:00" offsets) or Unix milliseconds. */
int api_parse_time_ms(const char *s, int64_t *ms) {
  char *end;
  if (*s >= '0' && *s <= '9' && strspn(s, "0123456789") == strlen(s)) {
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || strlen(s) > 15)
      return -1;
    *ms = v;
    return 0;
  }
  struct tm tm = {0};
  int used = 0;
  if (sscanf(s, "%4d-%2d-%2d%*1[Tt ]%2d:%2d:%2d%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour,
             &tm.tm_min, &tm.tm_sec, &used) != 6 ||
      used != 19)
    return -1;
  if (tm.tm_mon < 1 || tm.tm_mon > 12 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
      tm.tm_min > 59 || tm.tm_sec > 60)
    return -1;
  const char *p = s + used;
  int64_t frac = 0;
  if (*p == '.') {
    int digits = 0;
    for (p++; *p >= '0' && *p <= '9'; p++, digits++)
      if (digits < 3)
        frac = frac * 10 + (*p - '0');
    if (digits == 0)
      return -1;
    for (; digits < 3; digits++)
      frac *= 10;
  }
  int64_t off = 0;
  if (*p == 'Z' || *p == 'z') {
    p++;
  } else if (*p == '+' || *p == '-') {
    int hh, mm, k = 0;
    if (sscanf(p + 1, "%2d:%2d%n", &hh, &mm, &k) != 2 || k != 5 || hh > 23 || mm > 59)
      return -1;
    off = (hh * 60 + mm) * 60 * (*p == '+' ? 1 : -1);
    p += 6;
  } else {
    return -1;
  }
  if (*p)
    return -1;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  time_t t = timegm(&tm);
  if (t == (time_t)-1)
    return -1;
  *ms = ((int64_t)t - off) * 1000 + frac;
  return 0;
}
