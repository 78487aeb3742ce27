/* dockerfile_words.c -- the Dockerfile parser's words and lines: growing strings, quotes, escapes,
 * $-substitution, JSON arrays, paths, continuation lines and parser directives */
#include "dockerfile_internal.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../common/util.h"

/* ---- growing strings and string vectors ---- */

void df_sb_put(struct df_sb *b, const char *s, size_t n) {
  if (b->over || b->len + n > MOAT_DF_MAX_LINE) {
    b->over = true;
    return;
  }
  if (b->len + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + n + 1)
      cap *= 2;
    b->p = xrealloc(b->p, cap);
    b->cap = cap;
  }
  memcpy(b->p + b->len, s, n);
  b->len += n;
  b->p[b->len] = '\0';
}
void df_sb_putc(struct df_sb *b, char c) { df_sb_put(b, &c, 1); }
void df_sb_puts(struct df_sb *b, const char *s) { df_sb_put(b, s, strlen(s)); }
/* The string (owned by the caller), "" when nothing was put; b is empty again. */
char *df_sb_take(struct df_sb *b) {
  char *s = b->p ? b->p : xstrdup("");
  memset(b, 0, sizeof(*b));
  return s;
}
void df_sb_free(struct df_sb *b) {
  free(b->p);
  memset(b, 0, sizeof(*b));
}

/* Appends s (owned by v from now on); v->v stays NULL-terminated. */
void df_sv_push(struct df_sv *v, char *s) {
  if (v->n + 2 > v->cap) {
    v->cap = v->cap ? v->cap * 2 : 8;
    v->v = xrealloc(v->v, v->cap * sizeof(char *));
  }
  v->v[v->n++] = s;
  v->v[v->n] = NULL;
}
/* The vector (owned by the caller, never NULL); v is empty again. */
char **df_sv_take(struct df_sv *v) {
  char **r = v->v;
  if (!r) {
    r = xcalloc(1, sizeof(char *));
  }
  memset(v, 0, sizeof(*v));
  return r;
}
void df_sv_free(struct df_sv *v) {
  strv_free(v->v);
  memset(v, 0, sizeof(*v));
}

int df_fail(struct df *d, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  if (d->err_line)
    *d->err_line = d->line;
  if (d->line)
    return moat_error_set(d->err, EINVAL, "line %u: %s", d->line, msg);
  return moat_error_set(d->err, EINVAL, "%s", msg);
}

/* The value of name[0..n) in scope: ENV first, then an ARG with a value. NULL when unset. */
const char *df_lookup(struct df *d, const char *name, size_t n) {
  for (size_t i = 0; i < d->n_env; i++)
    if (strlen(d->env[i].key) == n && memcmp(d->env[i].key, name, n) == 0)
      return d->env[i].value;
  for (size_t i = 0; i < d->n_args; i++)
    if (strlen(d->args[i].name) == n && memcmp(d->args[i].name, name, n) == 0)
      return d->args[i].value;
  return NULL;
}

/* ---- words: quotes, escapes and substitution ---- */

struct lx {
  struct df *d;
  const char *s;
  size_t n, i;
  int flags;
  int depth;
};

bool df_blank(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\v' || c == '\f'; }
bool df_name_char(char c) { return isalnum((unsigned char)c) || c == '_'; }

static int lex_run(struct lx *x, int stop, struct df_sb *cur, struct df_sv *words, bool *in_word);

/* At x->s[x->i] == '$': appends the substitution to out. 0 or -1. */
static int lex_dollar(struct lx *x, struct df_sb *out) {
  struct df *d = x->d;
  x->i++;
  if (x->i >= x->n || (x->s[x->i] != '{' && !df_name_char(x->s[x->i]))) {
    df_sb_putc(out, '$');
    return 0;
  }
  if (x->s[x->i] != '{') {
    size_t st = x->i;
    while (x->i < x->n && df_name_char(x->s[x->i]))
      x->i++;
    const char *v = df_lookup(d, x->s + st, x->i - st);
    if (v)
      df_sb_puts(out, v);
    return 0;
  }
  x->i++;
  size_t st = x->i;
  while (x->i < x->n && df_name_char(x->s[x->i]))
    x->i++;
  size_t nl = x->i - st;
  if (nl == 0)
    return df_fail(d, "bad substitution: ${ without a variable name");
  if (x->i >= x->n)
    return df_fail(d, "bad substitution: ${%.*s without a closing }", (int)nl, x->s + st);
  const char *v = df_lookup(d, x->s + st, nl);
  if (x->s[x->i] == '}') {
    x->i++;
    if (v)
      df_sb_puts(out, v);
    return 0;
  }
  bool colon = false;
  if (x->s[x->i] == ':') {
    colon = true;
    x->i++;
  }
  char m = x->i < x->n ? x->s[x->i] : '\0';
  if (m != '-' && m != '+' && m != '?')
    return df_fail(d, "bad substitution: unsupported modifier in ${%.*s...}", (int)nl, x->s + st);
  x->i++;
  if (x->depth >= MOAT_DF_MAX_DEPTH)
    return df_fail(d, "substitutions nested deeper than %d", MOAT_DF_MAX_DEPTH);
  struct lx sub = {.d = d,
                   .s = x->s,
                   .n = x->n,
                   .i = x->i,
                   .flags = x->flags & ~(LX_SPLIT | LX_SPLITVARS),
                   .depth = x->depth + 1};
  struct df_sb w = {0};
  bool in_word = false;
  if (lex_run(&sub, '}', &w, NULL, &in_word) < 0) {
    df_sb_free(&w);
    return -1;
  }
  x->i = sub.i;
  bool set = v && (!colon || *v);
  if (m == '-')
    df_sb_puts(out, set ? v : (w.p ? w.p : ""));
  else if (m == '+') {
    if (set)
      df_sb_puts(out, w.p ? w.p : "");
  } else if (set)
    df_sb_puts(out, v);
  else {
    int rc = df_fail(d, "%.*s: %s", (int)nl, x->s + st, w.len ? w.p : "parameter not set or null");
    df_sb_free(&w);
    return rc;
  }
  bool over = w.over;
  df_sb_free(&w);
  if (over)
    out->over = true;
  return 0;
}

static void end_word(struct df_sb *cur, struct df_sv *words, bool *in_word) {
  if (*in_word)
    df_sv_push(words, df_sb_take(cur));
  *in_word = false;
}

/* Reads x->s from x->i to stop (a character, consumed) or, with stop < 0, to the end; appends to cur,
 * and with LX_SPLIT pushes each finished word onto words (the last one stays in cur, in_word says
 * whether there is one). 0 or -1. */
static int lex_run(struct lx *x, int stop, struct df_sb *cur, struct df_sv *words, bool *in_word) {
  struct df *d = x->d;
  bool strip = x->flags & LX_STRIP, expand = x->flags & LX_EXPAND, split = (x->flags & LX_SPLIT) && words;
  while (x->i < x->n) {
    if (cur->over)
      return df_fail(d, "a value is over %d bytes", MOAT_DF_MAX_LINE);
    if (words && words->n >= MOAT_DF_MAX_WORDS)
      return df_fail(d, "more than %d words", MOAT_DF_MAX_WORDS);
    char c = x->s[x->i];
    if (stop >= 0 && c == stop) {
      x->i++;
      return 0;
    }
    if (split && df_blank(c)) {
      end_word(cur, words, in_word);
      x->i++;
      continue;
    }
    *in_word = true;
    if (x->flags & LX_LITERAL) {
      if (c == d->esc && x->i + 1 < x->n && x->s[x->i + 1] == '$') {
        df_sb_putc(cur, '$');
        x->i += 2;
      } else if (c == '$' && expand) {
        if (lex_dollar(x, cur) < 0)
          return -1;
      } else {
        df_sb_putc(cur, c);
        x->i++;
      }
      continue;
    }
    if (c == '\'') {
      const char *q = memchr(x->s + x->i + 1, '\'', x->n - x->i - 1);
      if (!q)
        return df_fail(d, "unterminated single quote");
      size_t qi = (size_t)(q - x->s);
      if (strip)
        df_sb_put(cur, x->s + x->i + 1, qi - x->i - 1);
      else
        df_sb_put(cur, x->s + x->i, qi - x->i + 1);
      x->i = qi + 1;
      continue;
    }
    if (c == '"') {
      if (!strip)
        df_sb_putc(cur, '"');
      x->i++;
      for (;;) {
        if (x->i >= x->n)
          return df_fail(d, "unterminated double quote");
        char e = x->s[x->i];
        if (e == '"') {
          if (!strip)
            df_sb_putc(cur, '"');
          x->i++;
          break;
        }
        if (e == d->esc && x->i + 1 < x->n) {
          char nx = x->s[x->i + 1];
          if (!strip || (nx != '"' && nx != '$' && nx != d->esc))
            df_sb_putc(cur, e);
          df_sb_putc(cur, nx);
          x->i += 2;
          continue;
        }
        if (e == '$' && expand) {
          if (lex_dollar(x, cur) < 0)
            return -1;
          continue;
        }
        df_sb_putc(cur, e);
        x->i++;
      }
      continue;
    }
    if (c == d->esc) {
      if (!strip)
        df_sb_putc(cur, c);
      if (x->i + 1 < x->n)
        df_sb_putc(cur, x->s[x->i + 1]);
      x->i += 2;
      continue;
    }
    if (c == '$' && !expand && x->i + 1 < x->n && x->s[x->i + 1] == '{') {
      /* Unexpanded (a split before substitution): ${...} is one piece, blanks in its word too. */
      size_t k = x->i + 2, open = 1;
      while (k < x->n && open) {
        if (x->s[k] == '{' && x->s[k - 1] == '$')
          open++;
        else if (x->s[k] == '}')
          open--;
        k++;
      }
      df_sb_put(cur, x->s + x->i, k - x->i);
      x->i = k;
      continue;
    }
    if (c == '$' && expand) {
      if (!split || !(x->flags & LX_SPLITVARS)) {
        if (lex_dollar(x, cur) < 0)
          return -1;
      } else {
        struct df_sb v = {0};
        if (lex_dollar(x, &v) < 0) {
          df_sb_free(&v);
          return -1;
        }
        *in_word = cur->len > 0;
        for (size_t k = 0; k < v.len; k++) {
          if (df_blank(v.p[k]))
            end_word(cur, words, in_word);
          else {
            df_sb_putc(cur, v.p[k]);
            *in_word = true;
          }
          if (words->n >= MOAT_DF_MAX_WORDS)
            break;
        }
        if (v.over)
          cur->over = true;
        df_sb_free(&v);
      }
      continue;
    }
    df_sb_putc(cur, c);
    x->i++;
  }
  if (cur->over)
    return df_fail(d, "a value is over %d bytes", MOAT_DF_MAX_LINE);
  if (stop >= 0)
    return df_fail(d, "bad substitution: missing '%c'", stop);
  return 0;
}

/* Splits s[0..n) into words with flags (LX_SPLIT implied) into *out. 0 or -1. */
int df_lex_words(struct df *d, const char *s, size_t n, int flags, struct df_sv *out) {
  struct lx x = {.d = d, .s = s, .n = n, .flags = flags | LX_SPLIT};
  struct df_sb cur = {0};
  bool in_word = false;
  if (lex_run(&x, -1, &cur, out, &in_word) < 0) {
    df_sb_free(&cur);
    return -1;
  }
  end_word(&cur, out, &in_word);
  df_sb_free(&cur);
  if (out->n > MOAT_DF_MAX_WORDS)
    return df_fail(d, "more than %d words", MOAT_DF_MAX_WORDS);
  return 0;
}

/* s as one word (blanks kept) with substitution, quotes and escapes removed; NULL on error. */
char *df_lex_one(struct df *d, const char *s, int flags) {
  struct lx x = {.d = d, .s = s, .n = strlen(s), .flags = flags};
  struct df_sb cur = {0};
  bool in_word = false;
  if (lex_run(&x, -1, &cur, NULL, &in_word) < 0) {
    df_sb_free(&cur);
    return NULL;
  }
  return df_sb_take(&cur);
}

/* The end of the word starting at s[i] (quotes and escapes kept together). */
size_t df_word_end(const char *s, size_t i, char esc) {
  while (s[i] && !df_blank(s[i])) {
    if (s[i] == esc && s[i + 1]) {
      i += 2;
    } else if (s[i] == '"' || s[i] == '\'') {
      const char *q = strchr(s + i + 1, s[i]);
      i = q ? (size_t)(q - s) + 1 : strlen(s);
    } else if (s[i] == '$' && s[i + 1] == '{') {
      size_t open = 1;
      for (i += 2; s[i] && open; i++)
        if (s[i] == '{' && s[i - 1] == '$')
          open++;
        else if (s[i] == '}')
          open--;
    } else {
      i++;
    }
  }
  return i;
}

const char *df_skip_blank(const char *s) {
  while (*s && df_blank(*s))
    s++;
  return s;
}

/* Whether text starts a JSON array that must parse: `["` or `[]` (blanks allowed after '['). */
bool df_looks_json(const char *text) {
  if (text[0] != '[')
    return false;
  const char *p = df_skip_blank(text + 1);
  return *p == '"' || *p == ']';
}

/* Parses text as a JSON array of strings into *out. 0 or -1. */
int df_parse_json(struct df *d, const char *what, const char *text, struct df_sv *out) {
  json_error_t je;
  json_t *j = json_loads(text, 0, &je);
  if (!j)
    return df_fail(d, "%s: the JSON array does not parse: %s", what, je.text);
  if (!json_is_array(j)) {
    json_decref(j);
    return df_fail(d, "%s: not a JSON array", what);
  }
  if (json_array_size(j) > MOAT_DF_MAX_WORDS) {
    json_decref(j);
    return df_fail(d, "%s: a JSON array of more than %d elements", what, MOAT_DF_MAX_WORDS);
  }
  size_t i;
  json_t *e;
  json_array_foreach(j, i, e) {
    if (!json_is_string(e)) {
      json_decref(j);
      return df_fail(d, "%s: element %zu of the JSON array is not a string", what, i);
    }
    df_sv_push(out, xstrdup(json_string_value(e)));
  }
  json_decref(j);
  return 0;
}

/* Whether text holds a heredoc (`<<EOF`, `<<-"EOF"`) at the start of a word. */
bool df_has_heredoc(const char *text) {
  for (const char *p = strstr(text, "<<"); p; p = strstr(p + 2, "<<")) {
    if (p != text && !df_blank(p[-1]))
      continue;
    const char *q = p + 2;
    if (*q == '-')
      q++;
    if (*q == '"' || *q == '\'')
      q++;
    if (isalpha((unsigned char)*q) || *q == '_')
      return true;
  }
  return false;
}

/* "a" joined with relative "b" (absolute b replaces), cleaned: no "//", ".", "..", trailing '/'. */
char *df_path_join_clean(const char *a, const char *b) {
  _cleanup_free_ char *joined = b[0] == '/' ? xstrdup(b) : xasprintf("%s/%s", a ? a : "/", b);
  struct df_sb out = {0};
  const char *p = joined;
  size_t n_marks = strlen(joined) / 2 + 1, depth = 0;
  _cleanup_free_ size_t *marks = xcalloc(n_marks, sizeof(size_t));
  while (*p) {
    while (*p == '/')
      p++;
    const char *e = strchr(p, '/');
    size_t l = e ? (size_t)(e - p) : strlen(p);
    if (l == 0)
      break;
    if (l == 1 && p[0] == '.') {
    } else if (l == 2 && p[0] == '.' && p[1] == '.') {
      if (depth > 0) {
        out.len = marks[--depth];
        out.p[out.len] = '\0';
      }
    } else {
      if (depth < n_marks)
        marks[depth++] = out.len;
      df_sb_putc(&out, '/');
      df_sb_put(&out, p, l);
    }
    p += l;
  }
  if (!out.len)
    df_sb_putc(&out, '/');
  return df_sb_take(&out);
}

/* ---- lines ---- */

/* The next physical line (without its "\n" or "\r\n") in *l, *len; false at the end. */
bool df_next_line(struct df_lines *ls, const char **l, size_t *len) {
  if (ls->pos >= ls->n)
    return false;
  const char *p = ls->s + ls->pos;
  const char *nl = memchr(p, '\n', ls->n - ls->pos);
  size_t e = nl ? (size_t)(nl - p) : ls->n - ls->pos;
  ls->pos += e + (nl ? 1 : 0);
  if (e > 0 && p[e - 1] == '\r')
    e--;
  *l = p;
  *len = e;
  ls->no++;
  return true;
}

bool df_blank_or_comment(const char *l, size_t n) {
  size_t i = 0;
  while (i < n && df_blank(l[i]))
    i++;
  return i == n || l[i] == '#';
}

/* With the line ending in the escape character and blanks: strips them and returns true. */
bool df_strip_continuation(struct df_sb *b, char esc) {
  size_t e = b->len;
  while (e > 0 && (b->p[e - 1] == ' ' || b->p[e - 1] == '\t'))
    e--;
  if (e == 0 || b->p[e - 1] != esc)
    return false;
  b->len = e - 1;
  b->p[b->len] = '\0';
  return true;
}

/* A parser directive line "# key=value": 1 (key, value set), 0 (not one), -1 (error). */
int df_directive(struct df *d, const char *l, size_t n, bool *seen_escape) {
  size_t i = 0;
  if (n == 0 || l[0] != '#')
    return 0;
  i = 1;
  while (i < n && df_blank(l[i]))
    i++;
  size_t ks = i;
  while (i < n && isalnum((unsigned char)l[i]))
    i++;
  size_t ke = i;
  while (i < n && df_blank(l[i]))
    i++;
  if (ke == ks || i >= n || l[i] != '=')
    return 0;
  i++;
  while (i < n && df_blank(l[i]))
    i++;
  size_t vs = i, ve = n;
  while (ve > vs && df_blank(l[ve - 1]))
    ve--;
  if (ve == vs)
    return 0;
  size_t kl = ke - ks;
  if (kl == 6 && strncasecmp(l + ks, "escape", 6) == 0) {
    if (*seen_escape)
      return df_fail(d, "only one escape parser directive can be used");
    *seen_escape = true;
    if (ve - vs != 1 || (l[vs] != '\\' && l[vs] != '`'))
      return df_fail(d, "invalid escape token '%.*s' (\\ or ` only)", (int)(ve - vs < 8 ? ve - vs : 8),
                     l + vs);
    d->esc = l[vs];
    return 1;
  }
  if ((kl == 6 && strncasecmp(l + ks, "syntax", 6) == 0) || (kl == 5 && strncasecmp(l + ks, "check", 5) == 0))
    return 1;
  return 0;
}
