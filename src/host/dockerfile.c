/* dockerfile.c -- parses a single-stage Dockerfile into a build plan (steps, cache keys, image
 * config); see dockerfile.h for the syntax, what is refused and the bounds */
#include "dockerfile_internal.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

static const char *const kind_names[] = {
    [MOAT_DF_FROM] = "FROM",
    [MOAT_DF_RUN] = "RUN",
    [MOAT_DF_COPY] = "COPY",
    [MOAT_DF_ADD] = "ADD",
    [MOAT_DF_ENV] = "ENV",
    [MOAT_DF_ARG] = "ARG",
    [MOAT_DF_WORKDIR] = "WORKDIR",
    [MOAT_DF_USER] = "USER",
    [MOAT_DF_EXPOSE] = "EXPOSE",
    [MOAT_DF_LABEL] = "LABEL",
    [MOAT_DF_ENTRYPOINT] = "ENTRYPOINT",
    [MOAT_DF_CMD] = "CMD",
    [MOAT_DF_HEALTHCHECK] = "HEALTHCHECK",
    [MOAT_DF_SHELL] = "SHELL",
    [MOAT_DF_STOPSIGNAL] = "STOPSIGNAL",
    [MOAT_DF_VOLUME] = "VOLUME",
    [MOAT_DF_MAINTAINER] = "MAINTAINER",
};

const char *moat_df_kind_name(enum moat_df_kind k) {
  if ((size_t)k < sizeof(kind_names) / sizeof(kind_names[0]) && kind_names[k])
    return kind_names[k];
  return "?";
}

static bool is_proxy_arg(const char *name) {
  static const char *const proxies[] = {"HTTP_PROXY", "HTTPS_PROXY", "FTP_PROXY", "NO_PROXY", "ALL_PROXY"};
  for (size_t i = 0; i < sizeof(proxies) / sizeof(proxies[0]); i++) {
    if (strcmp(name, proxies[i]) == 0)
      return true;
    char lower[16];
    size_t l = strlen(proxies[i]);
    for (size_t k = 0; k <= l; k++)
      lower[k] = (char)tolower((unsigned char)proxies[i][k]);
    if (strcmp(name, lower) == 0)
      return true;
  }
  return false;
}

/* ---- instruction pieces ---- */

struct flag {
  char *name;
  char *value; /* NULL: --name alone */
  bool used;
};
#define MAX_FLAGS 16

struct inst {
  char name[16];    /* upper case */
  char *source;     /* the logical line, trimmed */
  const char *rest; /* after the name and the flags, trimmed (points into source) */
  struct flag flags[MAX_FLAGS];
  size_t n_flags;
};

static void inst_clear(struct inst *in) {
  for (size_t i = 0; i < in->n_flags; i++) {
    free(in->flags[i].name);
    free(in->flags[i].value);
  }
  free(in->source);
  memset(in, 0, sizeof(*in));
}

/* Splits line into the instruction name, its leading --flags and the rest. 0 or -1. */
static int inst_split(struct df *d, char *line, struct inst *in) {
  in->source = line;
  size_t i = 0;
  while (line[i] && !df_blank(line[i]))
    i++;
  for (size_t k = 0; k < i; k++)
    if (!isalpha((unsigned char)line[k]))
      return df_fail(d, "not an instruction: %.*s", (int)(i < 40 ? i : 40), line);
  if (i >= sizeof(in->name))
    return df_fail(d, "unknown instruction %.*s", (int)(i < 40 ? i : 40), line);
  for (size_t k = 0; k < i; k++)
    in->name[k] = (char)toupper((unsigned char)line[k]);
  const char *r = df_skip_blank(line + i);
  while (r[0] == '-' && r[1] == '-') {
    size_t e = df_word_end(r, 0, d->esc);
    if (e == 2) {
      r = df_skip_blank(r + 2);
      break;
    }
    if (in->n_flags >= MAX_FLAGS)
      return df_fail(d, "%s: more than %d flags", in->name, MAX_FLAGS);
    const char *eq = memchr(r + 2, '=', e - 2);
    struct flag *f = &in->flags[in->n_flags++];
    f->name = xstrndup(r + 2, (eq ? (size_t)(eq - r) : e) - 2);
    f->value = eq ? xstrndup(eq + 1, e - (size_t)(eq - r) - 1) : NULL;
    r = df_skip_blank(r + e);
  }
  in->rest = r;
  return 0;
}

/* The flag's value (NULL when absent; "" for --name alone), marked as used. */
static struct flag *flag_take(struct inst *in, const char *name) {
  struct flag *found = NULL;
  for (size_t i = 0; i < in->n_flags; i++)
    if (strcmp(in->flags[i].name, name) == 0) {
      in->flags[i].used = true;
      found = &in->flags[i];
    }
  return found;
}

/* Fails on a flag in refused (each "name:why") or any flag not taken. 0 or -1. */
static int flags_check(struct df *d, struct inst *in, const char *const *refused) {
  for (size_t i = 0; i < in->n_flags; i++) {
    if (in->flags[i].used)
      continue;
    for (size_t k = 0; refused && refused[k]; k++) {
      const char *colon = strchr(refused[k], ':');
      if (strlen(in->flags[i].name) == (size_t)(colon - refused[k]) &&
          memcmp(in->flags[i].name, refused[k], (size_t)(colon - refused[k])) == 0)
        return df_fail(d, "%s --%s is not supported: %s", in->name, in->flags[i].name, colon + 1);
    }
    return df_fail(d, "%s: unknown flag --%s", in->name, in->flags[i].name);
  }
  return 0;
}

/* The command of RUN/CMD/ENTRYPOINT/HEALTHCHECK CMD: JSON exec form or SHELL + [text]. 0 or -1. */
static int command_argv(struct df *d, const char *what, const char *text, struct df_sv *out,
                        bool *shell_form) {
  if (df_looks_json(text)) {
    *shell_form = false;
    return df_parse_json(d, what, text, out);
  }
  *shell_form = true;
  if (!*text)
    return df_fail(d, "%s needs a command", what);
  for (size_t i = 0; d->shell[i]; i++)
    df_sv_push(out, xstrdup(d->shell[i]));
  df_sv_push(out, xstrdup(text));
  return 0;
}

static void kv_set(struct moat_df_kv **kv, size_t *n, const char *key, const char *value) {
  for (size_t i = 0; i < *n; i++)
    if (strcmp((*kv)[i].key, key) == 0) {
      free((*kv)[i].value);
      (*kv)[i].value = xstrdup(value);
      return;
    }
  *kv = xrealloc(*kv, (*n + 1) * sizeof(**kv));
  (*kv)[*n].key = xstrdup(key);
  (*kv)[*n].value = xstrdup(value);
  (*n)++;
}

static void kv_free(struct moat_df_kv *kv, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(kv[i].key);
    free(kv[i].value);
  }
  free(kv);
}

static void vars_free(struct df_var *v, size_t n) {
  for (size_t i = 0; i < n; i++) {
    free(v[i].name);
    free(v[i].value);
  }
  free(v);
}

/* ---- the canonical text of a step ---- */

static void canon_field(struct df_sb *c, const char *tag, const char *v) {
  df_sb_puts(c, tag);
  df_sb_putc(c, '=');
  df_sb_puts(c, v ? v : "");
  df_sb_putc(c, '\0');
}

static void canon_list(struct df_sb *c, const char *tag, char *const *v) {
  char n[32];
  snprintf(n, sizeof(n), "%zu", strv_len(v));
  canon_field(c, tag, n);
  for (size_t i = 0; v && v[i]; i++)
    canon_field(c, "", v[i]);
}

/* ---- instructions ---- */

static struct moat_df_step *new_step(struct df *d, enum moat_df_kind k, const char *source) {
  struct moat_df_plan *p = d->plan;
  p->steps = xrealloc(p->steps, (p->n_steps + 1) * sizeof(*p->steps));
  struct moat_df_step *st = &p->steps[p->n_steps++];
  memset(st, 0, sizeof(*st));
  st->kind = k;
  st->line = d->line;
  st->source = xstrdup(source);
  st->workdir = xstrdup(d->workdir ? d->workdir : "/");
  st->user = d->user ? xstrdup(d->user) : NULL;
  st->changes_fs =
      k == MOAT_DF_FROM || k == MOAT_DF_RUN || k == MOAT_DF_COPY || k == MOAT_DF_ADD || k == MOAT_DF_WORKDIR;
  st->wants_digest = k == MOAT_DF_FROM || k == MOAT_DF_COPY || k == MOAT_DF_ADD;
  return st;
}

static void step_set_argv(struct moat_df_step *st, struct df_sv *v) {
  st->argc = v->n;
  st->argv = df_sv_take(v);
}

/* The value a declared ARG gets: the build arg, else its default, else (in the stage) the global
 * ARG's value. */
static const char *arg_value(struct df *d, const char *name, const char *deflt) {
  for (size_t i = 0; i < d->n_bargs; i++)
    if (strcmp(d->bargs[i].key, name) == 0) {
      d->bargs_used[i] = true;
      return d->bargs[i].value ? d->bargs[i].value : "";
    }
  if (deflt)
    return deflt;
  if (d->seen_from)
    for (size_t i = 0; i < d->n_meta; i++)
      if (strcmp(d->meta[i].name, name) == 0)
        return d->meta[i].value;
  return NULL;
}

static bool valid_arg_name(const char *s) {
  if (!(isalpha((unsigned char)*s) || *s == '_'))
    return false;
  for (; *s; s++)
    if (!df_name_char(*s) && *s != '-' && *s != '.')
      return false;
  return true;
}

static int do_arg(struct df *d, struct inst *in) {
  if (flags_check(d, in, NULL) < 0)
    return -1;
  struct df_sv words = {0};
  if (df_lex_words(d, in->rest, strlen(in->rest), 0, &words) < 0)
    goto fail;
  if (words.n == 0) {
    df_fail(d, "ARG needs a name");
    goto fail;
  }
  /* The ARGs before FROM are no step: they reach the plan through FROM's image and the stage's ARGs. */
  struct moat_df_step *st = d->seen_from ? new_step(d, MOAT_DF_ARG, in->source) : NULL;
  struct df_sb canon = {0};
  canon_field(&canon, "kind", "ARG");
  for (size_t w = 0; w < words.n; w++) {
    char *eq = strchr(words.v[w], '=');
    _cleanup_free_ char *name = eq ? xstrndup(words.v[w], (size_t)(eq - words.v[w])) : xstrdup(words.v[w]);
    if (!valid_arg_name(name)) {
      df_fail(d, "ARG: not a valid name: %.64s", name);
      df_sb_free(&canon);
      goto fail;
    }
    _cleanup_free_ char *deflt = NULL;
    if (eq && !(deflt = df_lex_one(d, eq + 1, EXPAND_WORD))) {
      df_sb_free(&canon);
      goto fail;
    }
    const char *v = arg_value(d, name, deflt);
    size_t k;
    for (k = 0; k < d->n_args; k++)
      if (strcmp(d->args[k].name, name) == 0)
        break;
    if (k == d->n_args) {
      if (d->n_args + d->n_env >= MOAT_DF_MAX_VARS) {
        df_fail(d, "more than %d variables", MOAT_DF_MAX_VARS);
        df_sb_free(&canon);
        goto fail;
      }
      d->args = xrealloc(d->args, (d->n_args + 1) * sizeof(*d->args));
      d->args[d->n_args++] = (struct df_var){.name = xstrdup(name), .value = NULL};
    }
    char *nv = v ? xstrdup(v) : NULL;
    free(d->args[k].value);
    d->args[k].value = nv;
    canon_field(&canon, "name", name);
    if (!st)
      continue;
    st->kv = xrealloc(st->kv, (st->n_kv + 1) * sizeof(*st->kv));
    st->kv[st->n_kv++] = (struct moat_df_kv){.key = xstrdup(name), .value = v ? xstrdup(v) : NULL};
  }
  if (st) {
    st->argv = xcalloc(1, sizeof(char *));
    st->canon_len = canon.len;
    st->canon = df_sb_take(&canon);
  }
  df_sb_free(&canon);
  df_sv_free(&words);
  return 0;
fail:
  df_sv_free(&words);
  return -1;
}

static int do_from(struct df *d, struct inst *in) {
  static const char *const refused[] = {"platform:images are of the machine's architecture", NULL};
  if (flags_check(d, in, refused) < 0)
    return -1;
  if (d->seen_from) {
    unsigned first = 0;
    for (size_t i = 0; i < d->plan->n_steps; i++)
      if (d->plan->steps[i].kind == MOAT_DF_FROM)
        first = d->plan->steps[i].line;
    return df_fail(d, "a second FROM: multi-stage builds are not supported (the first FROM is on line %u)",
                   first);
  }
  struct df_sv words = {0};
  if (df_lex_words(d, in->rest, strlen(in->rest), 0, &words) < 0)
    goto fail;
  if (words.n == 0) {
    df_fail(d, "FROM needs an image");
    goto fail;
  }
  if (words.n != 1 && !(words.n == 3 && strcasecmp(words.v[1], "AS") == 0)) {
    df_fail(d, "FROM takes an image and optionally AS name");
    goto fail;
  }
  char *image = df_lex_one(d, words.v[0], EXPAND_WORD);
  if (!image)
    goto fail;
  if (!*image || strchr(image, ' ') || strchr(image, '\t')) {
    df_fail(d, "FROM: %s image name", *image ? "not an" : "an empty");
    free(image);
    goto fail;
  }
  struct moat_df_step *st = new_step(d, MOAT_DF_FROM, in->source);
  struct df_sv a = {0};
  df_sv_push(&a, image);
  step_set_argv(st, &a);
  if (words.n == 3) {
    st->stage = xstrdup(words.v[2]);
    for (char *p = st->stage; *p; p++)
      *p = (char)tolower((unsigned char)*p);
  }
  d->plan->config.from = xstrdup(image);
  struct df_sb canon = {0};
  canon_field(&canon, "kind", "FROM");
  canon_field(&canon, "image", image);
  st->canon_len = canon.len;
  st->canon = df_sb_take(&canon);
  d->seen_from = true;
  d->meta = d->args;
  d->n_meta = d->n_args;
  d->args = NULL;
  d->n_args = 0;
  df_sv_free(&words);
  return 0;
fail:
  df_sv_free(&words);
  return -1;
}

static void env_strv(struct df *d, struct df_sv *out, bool with_undeclared_proxies) {
  for (size_t i = 0; i < d->n_env; i++)
    df_sv_push(out, xasprintf("%s=%s", d->env[i].key, d->env[i].value));
  for (size_t i = 0; i < d->n_args; i++) {
    if (!d->args[i].value)
      continue;
    bool shadowed = false;
    for (size_t k = 0; k < d->n_env && !shadowed; k++)
      shadowed = strcmp(d->env[k].key, d->args[i].name) == 0;
    if (!shadowed)
      df_sv_push(out, xasprintf("%s=%s", d->args[i].name, d->args[i].value));
  }
  if (!with_undeclared_proxies)
    return;
  for (size_t i = 0; i < d->n_bargs; i++) {
    if (!is_proxy_arg(d->bargs[i].key) || df_lookup(d, d->bargs[i].key, strlen(d->bargs[i].key)))
      continue;
    d->bargs_used[i] = true;
    df_sv_push(out, xasprintf("%s=%s", d->bargs[i].key, d->bargs[i].value ? d->bargs[i].value : ""));
  }
}

static int do_run(struct df *d, struct inst *in) {
  static const char *const refused[] = {"mount:a build step sees only its layer and the context",
                                        "network:a build step always has the build sandbox's network",
                                        "security:a build step is never privileged", NULL};
  if (flags_check(d, in, refused) < 0)
    return -1;
  if (df_has_heredoc(in->rest))
    return df_fail(d, "RUN: heredocs (<<) are not supported");
  struct df_sv argv = {0};
  bool shell_form;
  if (command_argv(d, "RUN", in->rest, &argv, &shell_form) < 0) {
    df_sv_free(&argv);
    return -1;
  }
  if (argv.n == 0) {
    df_sv_free(&argv);
    return df_fail(d, "RUN needs a command");
  }
  struct moat_df_step *st = new_step(d, MOAT_DF_RUN, in->source);
  st->shell_form = shell_form;
  step_set_argv(st, &argv);
  struct df_sv env = {0};
  env_strv(d, &env, false);
  struct df_sb canon = {0};
  canon_field(&canon, "kind", "RUN");
  canon_list(&canon, "argv", st->argv);
  canon_list(&canon, "env", env.v);
  df_sv_free(&env);
  env_strv(d, &env, true);
  st->env = df_sv_take(&env);
  st->canon_len = canon.len;
  st->canon = df_sb_take(&canon);
  return 0;
}

static bool valid_chmod(const char *s) {
  size_t l = strlen(s);
  if (l == 0 || l > 4)
    return false;
  for (size_t i = 0; i < l; i++)
    if (s[i] < '0' || s[i] > '7')
      return false;
  return true;
}

/* Whether a destination names a directory as Docker reads it: "/" last, or ".", or "/." last. */
static bool names_dir(const char *s) {
  size_t l = strlen(s);
  return s[l - 1] == '/' || strcmp(s, ".") == 0 || (l >= 2 && strcmp(s + l - 2, "/.") == 0);
}

static bool is_url(const char *s) { return strstr(s, "://") != NULL || strncmp(s, "git@", 4) == 0; }

static int do_copy(struct df *d, struct inst *in, enum moat_df_kind k) {
  static const char *const refused_copy[] = {
      "from:there are no build stages (the Dockerfile is single-stage) and no image to copy from",
      "link:layers are not relinked", "parents:not supported", "exclude:not supported", NULL};
  static const char *const refused_add[] = {
      "from:there are no build stages (the Dockerfile is single-stage) and no image to copy from",
      "link:layers are not relinked",
      "checksum:ADD of a URL is not supported",
      "keep-git-dir:ADD of a git repository is not supported",
      "parents:not supported",
      "exclude:not supported",
      NULL};
  const char *what = moat_df_kind_name(k);
  struct flag *chown = flag_take(in, "chown"), *chmod = flag_take(in, "chmod");
  if (flags_check(d, in, k == MOAT_DF_ADD ? refused_add : refused_copy) < 0)
    return -1;
  if (df_has_heredoc(in->rest))
    return df_fail(d, "%s: heredocs (<<) are not supported", what);
  struct df_sv raw = {0}, words = {0};
  _cleanup_free_ char *own = NULL, *mode = NULL;
  if (chown && (!chown->value || !(own = df_lex_one(d, chown->value, EXPAND_WORD))))
    goto fail_flag;
  if (chmod && (!chmod->value || !(mode = df_lex_one(d, chmod->value, EXPAND_WORD))))
    goto fail_flag;
  if (own && !*own) {
    df_fail(d, "%s --chown needs user[:group]", what);
    goto fail;
  }
  if (mode && !valid_chmod(mode)) {
    df_fail(d, "%s --chmod takes an octal mode (e.g. 0755), not %.32s", what, mode);
    goto fail;
  }
  bool json = df_looks_json(in->rest);
  if (json ? df_parse_json(d, what, in->rest, &raw) < 0
           : df_lex_words(d, in->rest, strlen(in->rest), 0, &raw) < 0)
    goto fail;
  for (size_t i = 0; i < raw.n; i++) {
    char *w = df_lex_one(d, raw.v[i], json ? LX_EXPAND | LX_LITERAL : EXPAND_WORD);
    if (!w)
      goto fail;
    df_sv_push(&words, w);
    if (!*w) {
      df_fail(d, "%s: an empty %s", what, i + 1 == raw.n ? "destination" : "source");
      goto fail;
    }
  }
  if (words.n < 2) {
    df_fail(d, "%s needs a source and a destination", what);
    goto fail;
  }
  if (words.n > 2 && !names_dir(words.v[words.n - 1])) {
    df_fail(d, "%s with more than one source needs a destination directory ending with /", what);
    goto fail;
  }
  for (size_t i = 0; k == MOAT_DF_ADD && i + 1 < words.n; i++)
    if (is_url(words.v[i])) {
      df_fail(d, "ADD of a URL or a git repository is not supported (%.64s): RUN curl or git clone instead",
              words.v[i]);
      goto fail;
    }
  struct moat_df_step *st = new_step(d, k, in->source);
  st->chown = own ? xstrdup(own) : NULL;
  st->chmod = mode ? xstrdup(mode) : NULL;
  step_set_argv(st, &words);
  struct df_sb canon = {0};
  canon_field(&canon, "kind", what);
  canon_field(&canon, "chown", st->chown);
  canon_field(&canon, "chmod", st->chmod);
  canon_list(&canon, "argv", st->argv);
  st->canon_len = canon.len;
  st->canon = df_sb_take(&canon);
  df_sv_free(&raw);
  return 0;
fail_flag:
  if (!d->err || !*d->err)
    df_fail(d, "%s: --%s needs a value", what, chown && !chown->value ? "chown" : "chmod");
fail:
  df_sv_free(&raw);
  df_sv_free(&words);
  return -1;
}

/* ENV and LABEL: k=v pairs (or the legacy "k v"), values substituted with the variables from
 * before the instruction, into st->kv. 0 or -1. */
static int parse_pairs(struct df *d, struct inst *in, struct moat_df_step **stp, enum moat_df_kind k) {
  const char *what = moat_df_kind_name(k);
  if (flags_check(d, in, NULL) < 0)
    return -1;
  struct df_sv raw = {0};
  if (df_lex_words(d, in->rest, strlen(in->rest), 0, &raw) < 0)
    goto fail;
  if (raw.n == 0) {
    df_fail(d, "%s needs key=value", what);
    goto fail;
  }
  struct moat_df_kv *kv = NULL;
  size_t n = 0;
  if (!strchr(raw.v[0], '=')) {
    size_t e = df_word_end(in->rest, 0, d->esc);
    const char *v = df_skip_blank(in->rest + e);
    if (!*v) {
      df_fail(d, "%s %.64s needs a value (%s key=value or %s key value)", what, raw.v[0], what, what);
      goto fail;
    }
    char *key = df_lex_one(d, raw.v[0], EXPAND_WORD);
    char *val = key ? df_lex_one(d, v, EXPAND_WORD) : NULL;
    if (!val) {
      free(key);
      goto fail;
    }
    kv = xcalloc(1, sizeof(*kv));
    kv[0] = (struct moat_df_kv){.key = key, .value = val};
    n = 1;
  } else {
    kv = xcalloc(raw.n, sizeof(*kv));
    for (size_t i = 0; i < raw.n; i++) {
      if (!strchr(raw.v[i], '=')) {
        kv_free(kv, n);
        df_fail(d, "%s: %.64s is not key=value (the legacy %s key value takes one pair)", what, raw.v[i],
                what);
        goto fail;
      }
      char *w = df_lex_one(d, raw.v[i], EXPAND_WORD);
      if (!w) {
        kv_free(kv, n);
        goto fail;
      }
      char *eq = strchr(w, '=');
      if (!eq) {
        kv_free(kv, n);
        free(w);
        df_fail(d, "%s: %.64s is not key=value", what, raw.v[i]);
        goto fail;
      }
      kv[n].key = xstrndup(w, (size_t)(eq - w));
      kv[n].value = xstrdup(eq + 1);
      n++;
      free(w);
    }
  }
  for (size_t i = 0; i < n; i++)
    if (!*kv[i].key || (k == MOAT_DF_ENV && (strchr(kv[i].key, '=') || strpbrk(kv[i].key, " \t")))) {
      kv_free(kv, n);
      df_fail(d, "%s: an empty or invalid key", what);
      goto fail;
    }
  struct moat_df_step *st = new_step(d, k, in->source);
  st->kv = kv;
  st->n_kv = n;
  st->argv = xcalloc(1, sizeof(char *));
  struct df_sb canon = {0};
  canon_field(&canon, "kind", what);
  for (size_t i = 0; i < n; i++) {
    canon_field(&canon, "key", kv[i].key);
    canon_field(&canon, "value", kv[i].value);
  }
  st->canon_len = canon.len;
  st->canon = df_sb_take(&canon);
  *stp = st;
  df_sv_free(&raw);
  return 0;
fail:
  df_sv_free(&raw);
  return -1;
}

static int do_env(struct df *d, struct inst *in) {
  struct moat_df_step *st;
  if (parse_pairs(d, in, &st, MOAT_DF_ENV) < 0)
    return -1;
  for (size_t i = 0; i < st->n_kv; i++) {
    bool known = false;
    for (size_t k = 0; k < d->n_env && !known; k++)
      known = strcmp(d->env[k].key, st->kv[i].key) == 0;
    if (!known && d->n_env + d->n_args >= MOAT_DF_MAX_VARS)
      return df_fail(d, "more than %d variables", MOAT_DF_MAX_VARS);
    kv_set(&d->env, &d->n_env, st->kv[i].key, st->kv[i].value);
  }
  return 0;
}

static int do_label(struct df *d, struct inst *in) {
  struct moat_df_step *st;
  if (parse_pairs(d, in, &st, MOAT_DF_LABEL) < 0)
    return -1;
  struct moat_df_config *c = &d->plan->config;
  for (size_t i = 0; i < st->n_kv; i++) {
    if (c->n_labels >= MOAT_DF_MAX_VARS)
      return df_fail(d, "more than %d labels", MOAT_DF_MAX_VARS);
    kv_set(&c->labels, &c->n_labels, st->kv[i].key, st->kv[i].value);
  }
  return 0;
}

/* A step whose one argument is rest as one word (substituted when expand). */
static int one_word_step(struct df *d, struct inst *in, enum moat_df_kind k, bool expand, bool blanks_ok,
                         char **out) {
  const char *what = moat_df_kind_name(k);
  if (flags_check(d, in, NULL) < 0)
    return -1;
  char *w = expand ? df_lex_one(d, in->rest, EXPAND_WORD) : xstrdup(in->rest);
  if (!w)
    return -1;
  if (!*w || (!blanks_ok && strpbrk(w, " \t"))) {
    int rc = df_fail(d, "%s needs %s", what, *w ? "one word" : "an argument");
    free(w);
    return rc;
  }
  *out = w;
  return 0;
}

static void simple_step(struct df *d, struct inst *in, enum moat_df_kind k, char *arg) {
  struct moat_df_step *st = new_step(d, k, in->source);
  struct df_sv a = {0};
  df_sv_push(&a, arg);
  step_set_argv(st, &a);
  struct df_sb canon = {0};
  canon_field(&canon, "kind", moat_df_kind_name(k));
  canon_list(&canon, "argv", st->argv);
  st->canon_len = canon.len;
  st->canon = df_sb_take(&canon);
}

static int do_workdir(struct df *d, struct inst *in) {
  char *w;
  if (one_word_step(d, in, MOAT_DF_WORKDIR, true, true, &w) < 0)
    return -1;
  char *path = df_path_join_clean(d->workdir, w);
  free(w);
  free(d->workdir);
  d->workdir = xstrdup(path);
  free(d->plan->config.workdir);
  d->plan->config.workdir = xstrdup(path);
  simple_step(d, in, MOAT_DF_WORKDIR, path);
  return 0;
}

static int do_user(struct df *d, struct inst *in) {
  char *w;
  if (one_word_step(d, in, MOAT_DF_USER, true, false, &w) < 0)
    return -1;
  if (w[0] == ':' || w[strlen(w) - 1] == ':') {
    free(w);
    return df_fail(d, "USER takes user[:group]");
  }
  free(d->user);
  d->user = xstrdup(w);
  free(d->plan->config.user);
  d->plan->config.user = xstrdup(w);
  simple_step(d, in, MOAT_DF_USER, w);
  return 0;
}

static int do_stopsignal(struct df *d, struct inst *in) {
  char *w;
  if (one_word_step(d, in, MOAT_DF_STOPSIGNAL, true, false, &w) < 0)
    return -1;
  bool ok = true;
  if (isdigit((unsigned char)w[0])) {
    uint64_t v;
    ok = parse_u64(w, &v) == 0 && v >= 1 && v <= 64;
  } else {
    for (const char *p = w; *p && ok; p++)
      ok = isupper((unsigned char)*p) || isdigit((unsigned char)*p) || *p == '+' || *p == '-';
  }
  if (!ok) {
    int rc = df_fail(d, "STOPSIGNAL: not a signal: %.32s", w);
    free(w);
    return rc;
  }
  free(d->plan->config.stopsignal);
  d->plan->config.stopsignal = xstrdup(w);
  simple_step(d, in, MOAT_DF_STOPSIGNAL, w);
  return 0;
}

static int do_maintainer(struct df *d, struct inst *in) {
  char *w;
  if (one_word_step(d, in, MOAT_DF_MAINTAINER, false, true, &w) < 0)
    return -1;
  free(d->plan->config.maintainer);
  d->plan->config.maintainer = xstrdup(w);
  simple_step(d, in, MOAT_DF_MAINTAINER, w);
  return 0;
}

static int parse_port(const char *s, size_t n, unsigned *out) {
  if (n == 0 || n > 5)
    return -1;
  unsigned v = 0;
  for (size_t i = 0; i < n; i++) {
    if (!isdigit((unsigned char)s[i]))
      return -1;
    v = v * 10 + (unsigned)(s[i] - '0');
  }
  if (v == 0 || v > 65535)
    return -1;
  *out = v;
  return 0;
}

static const char *const protos[] = {"tcp", "udp", "sctp"};

static int do_expose(struct df *d, struct inst *in) {
  if (flags_check(d, in, NULL) < 0)
    return -1;
  struct df_sv words = {0}, norm = {0};
  if (df_lex_words(d, in->rest, strlen(in->rest), EXPAND_WORD | LX_SPLITVARS, &words) < 0)
    goto fail;
  if (words.n == 0) {
    df_fail(d, "EXPOSE needs a port");
    goto fail;
  }
  if (!d->ports)
    d->ports = xcalloc(3, 65536 / 8);
  for (size_t i = 0; i < words.n; i++) {
    const char *w = words.v[i];
    const char *slash = strchr(w, '/');
    size_t pl = slash ? (size_t)(slash - w) : strlen(w);
    int proto = 0;
    if (slash) {
      proto = -1;
      for (int k = 0; k < 3; k++)
        if (strcasecmp(slash + 1, protos[k]) == 0)
          proto = k;
    }
    const char *dash = memchr(w, '-', pl);
    unsigned lo, hi;
    if (proto < 0 || parse_port(w, dash ? (size_t)(dash - w) : pl, &lo) < 0 ||
        (dash ? parse_port(dash + 1, pl - (size_t)(dash - w) - 1, &hi) < 0 : (hi = lo, false)) || hi < lo) {
      df_fail(d, "EXPOSE: not a port, port/proto or range (tcp, udp, sctp): %.32s", w);
      goto fail;
    }
    for (unsigned p = lo; p <= hi; p++) {
      size_t bit = (size_t)proto * 65536 + p;
      if (d->ports[bit / 8] & (1u << (bit % 8)))
        continue;
      if (d->n_ports >= MOAT_DF_MAX_PORTS) {
        df_fail(d, "EXPOSE: more than %d ports", MOAT_DF_MAX_PORTS);
        goto fail;
      }
      d->ports[bit / 8] |= (uint8_t)(1u << (bit % 8));
      d->n_ports++;
    }
    df_sv_push(&norm, lo == hi ? xasprintf("%u/%s", lo, protos[proto])
                               : xasprintf("%u-%u/%s", lo, hi, protos[proto]));
  }
  struct moat_df_step *st = new_step(d, MOAT_DF_EXPOSE, in->source);
  step_set_argv(st, &norm);
  struct df_sb canon = {0};
  canon_field(&canon, "kind", "EXPOSE");
  canon_list(&canon, "argv", st->argv);
  st->canon_len = canon.len;
  st->canon = df_sb_take(&canon);
  df_sv_free(&words);
  return 0;
fail:
  df_sv_free(&words);
  df_sv_free(&norm);
  return -1;
}

static int do_volume(struct df *d, struct inst *in) {
  if (flags_check(d, in, NULL) < 0)
    return -1;
  struct df_sv words = {0};
  if (df_looks_json(in->rest) ? df_parse_json(d, "VOLUME", in->rest, &words) < 0
                              : df_lex_words(d, in->rest, strlen(in->rest), EXPAND_WORD, &words) < 0)
    goto fail;
  if (words.n == 0) {
    df_fail(d, "VOLUME needs a path");
    goto fail;
  }
  for (size_t i = 0; i < words.n; i++)
    if (!*words.v[i]) {
      df_fail(d, "VOLUME: an empty path");
      goto fail;
    }
  if (d->volumes.n + words.n > MOAT_DF_MAX_WORDS) {
    df_fail(d, "VOLUME: more than %d paths", MOAT_DF_MAX_WORDS);
    goto fail;
  }
  for (size_t i = 0; i < words.n; i++)
    df_sv_push(&d->volumes, xstrdup(words.v[i]));
  struct moat_df_step *st = new_step(d, MOAT_DF_VOLUME, in->source);
  step_set_argv(st, &words);
  struct df_sb canon = {0};
  canon_field(&canon, "kind", "VOLUME");
  canon_list(&canon, "argv", st->argv);
  st->canon_len = canon.len;
  st->canon = df_sb_take(&canon);
  return 0;
fail:
  df_sv_free(&words);
  return -1;
}

static int do_entrypoint_cmd(struct df *d, struct inst *in, enum moat_df_kind k) {
  const char *what = moat_df_kind_name(k);
  if (flags_check(d, in, NULL) < 0)
    return -1;
  struct df_sv argv = {0};
  bool shell_form;
  if (command_argv(d, what, in->rest, &argv, &shell_form) < 0) {
    df_sv_free(&argv);
    return -1;
  }
  struct moat_df_step *st = new_step(d, k, in->source);
  st->shell_form = shell_form;
  step_set_argv(st, &argv);
  struct moat_df_config *c = &d->plan->config;
  char ***slot = k == MOAT_DF_CMD ? &c->cmd : &c->entrypoint;
  strv_free(*slot);
  *slot = strv_dup(st->argv);
  if (k == MOAT_DF_CMD)
    c->cmd_set = true;
  else
    c->entrypoint_set = true;
  struct df_sb canon = {0};
  canon_field(&canon, "kind", what);
  canon_list(&canon, "argv", st->argv);
  st->canon_len = canon.len;
  st->canon = df_sb_take(&canon);
  return 0;
}

/* A Go duration ("30s", "1m30s", "1.5s", "250ms", "0") in milliseconds. 0 or -1. */
static int parse_duration(const char *s, uint64_t *ms) {
  if (strcmp(s, "0") == 0) {
    *ms = 0;
    return 0;
  }
  double total = 0;
  if (!*s)
    return -1;
  while (*s) {
    double v = 0, scale = 1;
    bool digits = false;
    for (; isdigit((unsigned char)*s); s++, digits = true)
      v = v * 10 + (*s - '0');
    if (*s == '.')
      for (s++; isdigit((unsigned char)*s); s++, digits = true)
        v += (*s - '0') * (scale /= 10);
    if (!digits || v > 1e13)
      return -1;
    double unit;
    if (strncmp(s, "ns", 2) == 0)
      unit = 1e-6, s += 2;
    else if (strncmp(s, "us", 2) == 0)
      unit = 1e-3, s += 2;
    else if (strncmp(s, "ms", 2) == 0)
      unit = 1, s += 2;
    else if (*s == 's')
      unit = 1e3, s += 1;
    else if (*s == 'm')
      unit = 60e3, s += 1;
    else if (*s == 'h')
      unit = 3600e3, s += 1;
    else
      return -1;
    total += v * unit;
    if (total > 1e13)
      return -1;
  }
  *ms = (uint64_t)total;
  if (total > 0 && *ms == 0)
    return -1;
  return 0;
}

static int do_healthcheck(struct df *d, struct inst *in) {
  struct flag *fl[5] = {flag_take(in, "interval"), flag_take(in, "timeout"), flag_take(in, "start-period"),
                        flag_take(in, "start-interval"), flag_take(in, "retries")};
  if (flags_check(d, in, NULL) < 0)
    return -1;
  struct moat_df_health h = {
      .set = true, .interval_ms = 30000, .timeout_ms = 30000, .start_interval_ms = 5000, .retries = 3};
  uint64_t *dur[4] = {&h.interval_ms, &h.timeout_ms, &h.start_period_ms, &h.start_interval_ms};
  static const char *const names[5] = {"interval", "timeout", "start-period", "start-interval", "retries"};
  for (int i = 0; i < 5; i++) {
    if (!fl[i])
      continue;
    if (!fl[i]->value)
      return df_fail(d, "HEALTHCHECK --%s needs a value", names[i]);
    if (i < 4) {
      if (parse_duration(fl[i]->value, dur[i]) < 0)
        return df_fail(d, "HEALTHCHECK --%s: not a duration of at least 1ms (e.g. 30s, 1m30s): %.32s",
                       names[i], fl[i]->value);
    } else {
      uint64_t v;
      if (parse_u64(fl[i]->value, &v) < 0 || v < 1 || v > 10000)
        return df_fail(d, "HEALTHCHECK --retries takes 1 to 10000, not %.32s", fl[i]->value);
      h.retries = (unsigned)v;
    }
  }
  size_t e = df_word_end(in->rest, 0, d->esc);
  const char *body = df_skip_blank(in->rest + e);
  struct df_sv argv = {0};
  if (e == 4 && strncasecmp(in->rest, "NONE", 4) == 0) {
    if (*body)
      return df_fail(d, "HEALTHCHECK NONE takes no arguments");
    if (in->n_flags)
      return df_fail(d, "HEALTHCHECK NONE takes no flags");
    h = (struct moat_df_health){.set = true, .none = true};
  } else if (e == 3 && strncasecmp(in->rest, "CMD", 3) == 0) {
    if (command_argv(d, "HEALTHCHECK CMD", body, &argv, &h.shell_form) < 0) {
      df_sv_free(&argv);
      return -1;
    }
    if (argv.n == 0) {
      df_sv_free(&argv);
      return df_fail(d, "HEALTHCHECK CMD needs a command");
    }
  } else {
    return df_fail(d, "HEALTHCHECK takes CMD command or NONE");
  }
  struct moat_df_step *st = new_step(d, MOAT_DF_HEALTHCHECK, in->source);
  st->shell_form = h.shell_form;
  step_set_argv(st, &argv);
  struct moat_df_config *c = &d->plan->config;
  strv_free(c->health.test);
  c->health = h;
  c->health.test = h.none ? NULL : strv_dup(st->argv);
  struct df_sb canon = {0};
  char num[160];
  snprintf(num, sizeof(num), "%d %llu %llu %llu %llu %u", h.none, (unsigned long long)h.interval_ms,
           (unsigned long long)h.timeout_ms, (unsigned long long)h.start_period_ms,
           (unsigned long long)h.start_interval_ms, h.retries);
  canon_field(&canon, "kind", "HEALTHCHECK");
  canon_field(&canon, "opts", num);
  canon_list(&canon, "argv", st->argv);
  st->canon_len = canon.len;
  st->canon = df_sb_take(&canon);
  return 0;
}

static int do_shell(struct df *d, struct inst *in) {
  if (flags_check(d, in, NULL) < 0)
    return -1;
  if (in->rest[0] != '[')
    return df_fail(d, "SHELL takes a JSON array, e.g. [\"/bin/bash\", \"-c\"]");
  struct df_sv argv = {0};
  if (df_parse_json(d, "SHELL", in->rest, &argv) < 0) {
    df_sv_free(&argv);
    return -1;
  }
  if (argv.n == 0) {
    df_sv_free(&argv);
    return df_fail(d, "SHELL needs at least the shell's path");
  }
  struct moat_df_step *st = new_step(d, MOAT_DF_SHELL, in->source);
  step_set_argv(st, &argv);
  strv_free(d->shell);
  d->shell = strv_dup(st->argv);
  struct df_sb canon = {0};
  canon_field(&canon, "kind", "SHELL");
  canon_list(&canon, "argv", st->argv);
  st->canon_len = canon.len;
  st->canon = df_sb_take(&canon);
  return 0;
}

static int dispatch(struct df *d, struct inst *in) {
  static const struct {
    const char *name;
    enum moat_df_kind kind;
  } table[] = {
      {"FROM", MOAT_DF_FROM},
      {"RUN", MOAT_DF_RUN},
      {"COPY", MOAT_DF_COPY},
      {"ADD", MOAT_DF_ADD},
      {"ENV", MOAT_DF_ENV},
      {"ARG", MOAT_DF_ARG},
      {"WORKDIR", MOAT_DF_WORKDIR},
      {"USER", MOAT_DF_USER},
      {"EXPOSE", MOAT_DF_EXPOSE},
      {"LABEL", MOAT_DF_LABEL},
      {"ENTRYPOINT", MOAT_DF_ENTRYPOINT},
      {"CMD", MOAT_DF_CMD},
      {"HEALTHCHECK", MOAT_DF_HEALTHCHECK},
      {"SHELL", MOAT_DF_SHELL},
      {"STOPSIGNAL", MOAT_DF_STOPSIGNAL},
      {"VOLUME", MOAT_DF_VOLUME},
      {"MAINTAINER", MOAT_DF_MAINTAINER},
  };
  if (strcmp(in->name, "ONBUILD") == 0)
    return df_fail(d, "ONBUILD is not supported (a template is not a base for later builds' triggers)");
  size_t i;
  for (i = 0; i < sizeof(table) / sizeof(table[0]); i++)
    if (strcmp(in->name, table[i].name) == 0)
      break;
  if (i == sizeof(table) / sizeof(table[0]))
    return df_fail(d, "unknown instruction %s", in->name);
  enum moat_df_kind k = table[i].kind;
  if (!d->seen_from && k != MOAT_DF_FROM && k != MOAT_DF_ARG)
    return df_fail(d, "%s before FROM (only ARG may come before FROM)", in->name);
  if (d->plan->n_steps >= MOAT_DF_MAX_STEPS)
    return df_fail(d, "more than %d instructions", MOAT_DF_MAX_STEPS);
  switch (k) {
  case MOAT_DF_FROM:
    return do_from(d, in);
  case MOAT_DF_RUN:
    return do_run(d, in);
  case MOAT_DF_COPY:
  case MOAT_DF_ADD:
    return do_copy(d, in, k);
  case MOAT_DF_ENV:
    return do_env(d, in);
  case MOAT_DF_ARG:
    return do_arg(d, in);
  case MOAT_DF_WORKDIR:
    return do_workdir(d, in);
  case MOAT_DF_USER:
    return do_user(d, in);
  case MOAT_DF_EXPOSE:
    return do_expose(d, in);
  case MOAT_DF_LABEL:
    return do_label(d, in);
  case MOAT_DF_ENTRYPOINT:
  case MOAT_DF_CMD:
    return do_entrypoint_cmd(d, in, k);
  case MOAT_DF_HEALTHCHECK:
    return do_healthcheck(d, in);
  case MOAT_DF_SHELL:
    return do_shell(d, in);
  case MOAT_DF_STOPSIGNAL:
    return do_stopsignal(d, in);
  case MOAT_DF_VOLUME:
    return do_volume(d, in);
  case MOAT_DF_MAINTAINER:
    return do_maintainer(d, in);
  }
  return df_fail(d, "unknown instruction %s", in->name);
}

/* ---- keys ---- */

static void compute_keys(struct moat_df_plan *p, size_t from) {
  for (size_t i = from; i < p->n_steps; i++) {
    struct moat_df_step *st = &p->steps[i];
    static const uint8_t zeros[MOAT_SHA256_LEN];
    struct moat_sha256 h;
    moat_sha256_init(&h);
    moat_sha256_update(&h, "moat-dockerfile-step-v1", 24);
    moat_sha256_update(&h, i ? p->steps[i - 1].key : zeros, MOAT_SHA256_LEN);
    moat_sha256_update(&h, st->canon, st->canon_len);
    uint8_t has = st->has_digest;
    moat_sha256_update(&h, &has, 1);
    if (has)
      moat_sha256_update(&h, st->digest, MOAT_SHA256_LEN);
    moat_sha256_final(&h, st->key);
    for (int k = 0; k < MOAT_SHA256_LEN; k++)
      snprintf(st->key_hex + 2 * k, 3, "%02x", st->key[k]);
  }
}

int moat_dockerfile_plan_set_digest(struct moat_df_plan *plan, size_t i,
                                    const uint8_t digest[MOAT_SHA256_LEN], moat_error **err) {
  if (!plan || i >= plan->n_steps)
    return moat_error_set(err, EINVAL, "no step %zu", i);
  struct moat_df_step *st = &plan->steps[i];
  if (!st->wants_digest)
    return moat_error_set(err, EINVAL, "step %zu (%s) takes no digest", i, moat_df_kind_name(st->kind));
  memcpy(st->digest, digest, MOAT_SHA256_LEN);
  st->has_digest = true;
  compute_keys(plan, i);
  return 0;
}

/* ---- the whole ---- */

static void finish_config(struct df *d) {
  struct moat_df_config *c = &d->plan->config;
  struct df_sv env = {0};
  for (size_t i = 0; i < d->n_env; i++)
    df_sv_push(&env, xasprintf("%s=%s", d->env[i].key, d->env[i].value));
  c->env = df_sv_take(&env);
  c->shell = strv_dup(d->shell);
  struct df_sv ports = {0};
  for (unsigned p = 1; d->ports && p < 65536; p++)
    for (int k = 0; k < 3; k++) {
      size_t bit = (size_t)k * 65536 + p;
      if (d->ports[bit / 8] & (1u << (bit % 8)))
        df_sv_push(&ports, xasprintf("%u/%s", p, protos[k]));
    }
  c->exposed = df_sv_take(&ports);
  c->volumes = df_sv_take(&d->volumes);
  c->argv = moat_dockerfile_start_argv(c, NULL, NULL);
}

static int parse_all(struct df *d, const char *text, size_t len) {
  if (len > MOAT_DF_MAX_SIZE)
    return df_fail(d, "the Dockerfile is over %d bytes", MOAT_DF_MAX_SIZE);
  const char *nul = memchr(text, '\0', len);
  if (nul) {
    d->line = 1;
    for (const char *p = text; p < nul; p++)
      d->line += *p == '\n';
    return df_fail(d, "a NUL byte");
  }
  struct df_lines ls = {.s = text, .n = len};
  const char *l;
  size_t n;
  bool directives = true, seen_escape = false;
  struct df_sb cur = {0};
  while (df_next_line(&ls, &l, &n)) {
    d->line = ls.no;
    if (directives) {
      int r = df_directive(d, l, n, &seen_escape);
      if (r < 0)
        return -1;
      if (r > 0)
        continue;
      directives = false;
    }
    if (df_blank_or_comment(l, n))
      continue;
    size_t i = 0;
    while (i < n && df_blank(l[i]))
      i++;
    df_sb_put(&cur, l + i, n - i);
    while (!cur.over && df_strip_continuation(&cur, d->esc)) {
      const char *c;
      size_t cn;
      bool more = false;
      while (df_next_line(&ls, &c, &cn))
        if (!df_blank_or_comment(c, cn)) {
          df_sb_put(&cur, c, cn);
          more = true;
          break;
        }
      if (!more)
        break;
    }
    if (cur.over) {
      df_sb_free(&cur);
      return df_fail(d, "an instruction is over %d bytes", MOAT_DF_MAX_LINE);
    }
    char *line = df_sb_take(&cur);
    size_t e = strlen(line);
    while (e > 0 && df_blank(line[e - 1]))
      line[--e] = '\0';
    struct inst in = {0};
    d->any = true;
    int rc = inst_split(d, line, &in);
    if (rc == 0)
      rc = dispatch(d, &in);
    inst_clear(&in);
    if (rc < 0)
      return -1;
  }
  if (!d->seen_from) {
    d->line = 0;
    return df_fail(d, d->any ? "no FROM instruction" : "no instructions: a Dockerfile needs FROM");
  }
  for (size_t i = 0; i < d->n_bargs; i++)
    if (!d->bargs_used[i] && !is_proxy_arg(d->bargs[i].key) && d->warnings.n < MOAT_DF_MAX_WARNINGS)
      df_sv_push(&d->warnings,
                 xasprintf("build arg %.64s was passed but not declared by an ARG", d->bargs[i].key));
  finish_config(d);
  d->plan->warnings = df_sv_take(&d->warnings);
  compute_keys(d->plan, 0);
  return 0;
}

struct moat_df_plan *moat_dockerfile_parse(const char *text, size_t len, const struct moat_df_kv *args,
                                           size_t n_args, unsigned *err_line, moat_error **err) {
  if (err_line)
    *err_line = 0;
  struct df d = {.esc = '\\', .err_line = err_line, .err = err, .bargs = args, .n_bargs = n_args};
  d.plan = xcalloc(1, sizeof(*d.plan));
  if (n_args > MOAT_DF_MAX_BUILD_ARGS) {
    df_fail(&d, "more than %d build args", MOAT_DF_MAX_BUILD_ARGS);
    moat_dockerfile_plan_free(d.plan);
    return NULL;
  }
  for (size_t i = 0; i < n_args; i++)
    if (!args[i].key || !valid_arg_name(args[i].key) || strlen(args[i].key) > 256 ||
        (args[i].value && strlen(args[i].value) > MOAT_DF_MAX_LINE)) {
      df_fail(&d, "build arg %zu: not a valid name or a value over %d bytes", i, MOAT_DF_MAX_LINE);
      moat_dockerfile_plan_free(d.plan);
      return NULL;
    }
  d.bargs_used = xcalloc(n_args + 1, sizeof(bool));
  struct df_sv sh = {0};
  df_sv_push(&sh, xstrdup("/bin/sh"));
  df_sv_push(&sh, xstrdup("-c"));
  d.shell = df_sv_take(&sh);
  int rc = parse_all(&d, text ? text : "", text ? len : 0);
  d.plan->escape = d.esc;
  kv_free(d.env, d.n_env);
  vars_free(d.args, d.n_args);
  vars_free(d.meta, d.n_meta);
  free(d.bargs_used);
  strv_free(d.shell);
  free(d.workdir);
  free(d.user);
  free(d.ports);
  df_sv_free(&d.volumes);
  df_sv_free(&d.warnings);
  if (rc < 0) {
    moat_dockerfile_plan_free(d.plan);
    return NULL;
  }
  return d.plan;
}

void moat_dockerfile_plan_free(struct moat_df_plan *p) {
  if (!p)
    return;
  for (size_t i = 0; i < p->n_steps; i++) {
    struct moat_df_step *st = &p->steps[i];
    free(st->source);
    strv_free(st->argv);
    free(st->stage);
    free(st->chown);
    free(st->chmod);
    kv_free(st->kv, st->n_kv);
    strv_free(st->env);
    free(st->workdir);
    free(st->user);
    free(st->canon);
  }
  free(p->steps);
  struct moat_df_config *c = &p->config;
  free(c->from);
  strv_free(c->env);
  free(c->workdir);
  free(c->user);
  strv_free(c->entrypoint);
  strv_free(c->cmd);
  strv_free(c->argv);
  strv_free(c->exposed);
  kv_free(c->labels, c->n_labels);
  strv_free(c->health.test);
  strv_free(c->shell);
  free(c->stopsignal);
  strv_free(c->volumes);
  free(c->maintainer);
  strv_free(p->warnings);
  free(p);
}

char **moat_dockerfile_start_argv(const struct moat_df_config *c, char *const *base_entrypoint,
                                  char *const *base_cmd) {
  char *const *ep = c->entrypoint_set ? c->entrypoint : base_entrypoint;
  char *const *cmd = c->cmd_set ? c->cmd : (c->entrypoint_set ? NULL : base_cmd);
  char **r = strv_concat(ep, cmd);
  if (!r || !r[0]) {
    strv_free(r);
    return NULL;
  }
  return r;
}
