/* fuzz_dockerfile.c -- libFuzzer target: the Dockerfile parser (host/dockerfile.c and
 * dockerfile_words.c), which reads the Dockerfile of every template build a client posts.
 *
 * Input: the Dockerfile's text, then optionally a NUL byte and build args, one "K=V" a line. Checks:
 * a plan has steps, the first a FROM and the only one, lines that never go back, argv
 * NULL-terminated at argc, 64-hex keys that chain (each differs from its parent's) and that a second
 * parse gives again; setting a digest changes the keys from that step on and no earlier one; the
 * start command merges with a base config; an error is EINVAL with a message, "line N: " first when
 * it names a line, and the line is within the text. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "host/dockerfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_plan(const struct moat_df_plan *p, size_t lines) {
  if (!p->n_steps || p->steps[0].kind != MOAT_DF_FROM || !p->config.from || !p->warnings || !p->config.env ||
      !p->config.exposed || !p->config.volumes || !p->config.shell || !p->config.shell[0])
    abort();
  unsigned last = 0;
  for (size_t i = 0; i < p->n_steps; i++) {
    const struct moat_df_step *st = &p->steps[i];
    if ((i > 0 && st->kind == MOAT_DF_FROM) || st->line < last || st->line == 0 || st->line > lines)
      abort();
    last = st->line;
    if (!st->argv || st->argv[st->argc] || strv_len(st->argv) != st->argc || !st->source || !st->workdir ||
        st->workdir[0] != '/' || !st->canon)
      abort();
    if (strlen(st->key_hex) != 64 || (i > 0 && memcmp(st->key, p->steps[i - 1].key, MOAT_SHA256_LEN) == 0))
      abort();
    if (st->kind == MOAT_DF_RUN && (!st->env || !st->argc))
      abort();
    if ((st->kind == MOAT_DF_COPY || st->kind == MOAT_DF_ADD) && st->argc < 2)
      abort();
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, '\0', size);
  size_t tl = nul ? (size_t)(nul - data) : size;
  struct moat_df_kv args[8];
  size_t n_args = 0;
  _cleanup_free_ char *argtext = nul ? xstrndup((const char *)nul + 1, size - tl - 1) : NULL;
  for (char *save = NULL, *l = argtext ? strtok_r(argtext, "\n", &save) : NULL; l && n_args < 8;
       l = strtok_r(NULL, "\n", &save)) {
    char *eq = strchr(l, '=');
    if (!eq)
      continue;
    *eq = '\0';
    args[n_args++] = (struct moat_df_kv){.key = l, .value = eq + 1};
  }
  size_t lines = 1;
  for (size_t i = 0; i < tl; i++)
    lines += data[i] == '\n';

  moat_error *err = NULL;
  unsigned line = 77;
  struct moat_df_plan *p = moat_dockerfile_parse((const char *)data, tl, args, n_args, &line, &err);
  if (!p) {
    if (!err || err->status != EINVAL || !err->msg || line > lines)
      abort();
    char want[32];
    snprintf(want, sizeof(want), "line %u: ", line);
    if (line && strncmp(err->msg, want, strlen(want)) != 0)
      abort();
    moat_error_free(&err);
    return 0;
  }
  if (err || line != 0)
    abort();
  check_plan(p, lines);

  struct moat_df_plan *q = moat_dockerfile_parse((const char *)data, tl, args, n_args, NULL, NULL);
  if (!q || q->n_steps != p->n_steps)
    abort();
  for (size_t i = 0; i < p->n_steps; i++)
    if (memcmp(p->steps[i].key, q->steps[i].key, MOAT_SHA256_LEN) != 0)
      abort();

  uint8_t digest[MOAT_SHA256_LEN];
  memset(digest, 0xab, sizeof(digest));
  for (size_t i = 0; i < p->n_steps; i++) {
    int rc = moat_dockerfile_plan_set_digest(p, i, digest, NULL);
    if ((rc == 0) != p->steps[i].wants_digest)
      abort();
    if (rc < 0)
      continue;
    for (size_t k = 0; k < p->n_steps; k++)
      if ((memcmp(p->steps[k].key, q->steps[k].key, MOAT_SHA256_LEN) == 0) != (k < i))
        abort();
    break;
  }
  char *ep[] = {"/ep", NULL}, *cmd[] = {"cmd", NULL};
  char **argv = moat_dockerfile_start_argv(&p->config, ep, cmd);
  if (argv && !argv[0])
    abort();
  strv_free(argv);
  moat_dockerfile_plan_free(q);
  moat_dockerfile_plan_free(p);
  return 0;
}
