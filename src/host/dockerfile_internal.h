/* dockerfile_internal.h -- what the Dockerfile parser's two files share: the parser's state, growing
 * strings and vectors, words (quotes, escapes, substitution) and lines (continuations, directives) */
#ifndef MOAT_HOST_DOCKERFILE_INTERNAL_H
#define MOAT_HOST_DOCKERFILE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dockerfile.h"

/* A growing string: NUL-terminated whenever p is not NULL. */
struct df_sb {
  char *p;
  size_t len, cap;
  bool over; /* an append would have passed MOAT_DF_MAX_LINE: dropped */
};

void df_sb_put(struct df_sb *b, const char *s, size_t n);
void df_sb_putc(struct df_sb *b, char c);
void df_sb_puts(struct df_sb *b, const char *s);
/* The string (owned by the caller), "" when nothing was put; b is empty again. */
char *df_sb_take(struct df_sb *b);
void df_sb_free(struct df_sb *b);

/* A growing NULL-terminated vector of owned strings. */
struct df_sv {
  char **v;
  size_t n, cap;
};

/* Appends s (owned by v from now on). */
void df_sv_push(struct df_sv *v, char *s);
/* The vector (owned by the caller, never NULL); v is empty again. */
char **df_sv_take(struct df_sv *v);
void df_sv_free(struct df_sv *v);

/* ---- parser state ---- */

struct df_var {
  char *name;
  char *value; /* NULL: declared without a value */
};

struct df {
  char esc;
  unsigned line; /* the current instruction's first line */
  unsigned *err_line;
  moat_error **err;
  struct moat_df_plan *plan;
  struct moat_df_kv *env; /* the ENV in effect, in order first set */
  size_t n_env;
  struct df_var *args; /* ARGs in scope: before FROM the global ones, after it the stage's */
  size_t n_args;
  struct df_var *meta; /* the ARGs declared before FROM, once FROM is seen */
  size_t n_meta;
  const struct moat_df_kv *bargs;
  size_t n_bargs;
  bool *bargs_used;
  bool seen_from;
  bool any; /* an instruction was seen */
  char **shell;
  char *workdir;
  char *user;
  uint8_t *ports; /* bitmap: 3 protocols x 65536 ports */
  size_t n_ports;
  struct df_sv volumes;
  struct df_sv warnings;
};

/* Sets *d->err (EINVAL, "line N: " + the message when d->line is not 0) and *d->err_line. -1. */
int df_fail(struct df *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* The value of name[0..n) in scope: ENV first, then an ARG with a value. NULL when unset. */
const char *df_lookup(struct df *d, const char *name, size_t n);

enum {
  LX_SPLIT = 1,     /* unquoted blanks separate words */
  LX_EXPAND = 2,    /* $-substitution */
  LX_STRIP = 4,     /* quotes and escapes are removed (else copied as written) */
  LX_SPLITVARS = 8, /* with LX_SPLIT: an unquoted substitution's blanks separate words too */
  LX_LITERAL = 16,  /* quotes and escapes are plain characters, but an escaped $ (a JSON element) */
};
#define EXPAND_WORD (LX_EXPAND | LX_STRIP)

/* Splits s[0..n) into words with flags (LX_SPLIT implied) into *out. 0 or -1. */
int df_lex_words(struct df *d, const char *s, size_t n, int flags, struct df_sv *out);
/* s as one word (blanks kept) processed with flags; NULL on error. */
char *df_lex_one(struct df *d, const char *s, int flags);
bool df_blank(char c);
bool df_name_char(char c);
/* The end of the word starting at s[i] (quotes, escapes and ${...} kept together). */
size_t df_word_end(const char *s, size_t i, char esc);
const char *df_skip_blank(const char *s);
/* Whether text starts a JSON array that must parse: `["` or `[]` (blanks allowed after '['). */
bool df_looks_json(const char *text);
/* Parses text as a JSON array of strings (at most MOAT_DF_MAX_WORDS) onto *out. 0 or -1. */
int df_parse_json(struct df *d, const char *what, const char *text, struct df_sv *out);
/* Whether text holds a heredoc (`<<EOF`, `<<-"EOF"`) at the start of a word. */
bool df_has_heredoc(const char *text);
/* a joined with b (an absolute b replaces a), cleaned: no "//", ".", "..", trailing '/'; never
 * above "/". Owned by the caller. */
char *df_path_join_clean(const char *a, const char *b);

/* The text's physical lines. */
struct df_lines {
  const char *s;
  size_t n, pos;
  unsigned no; /* the number of the line last read */
};
/* The next physical line (without its "\n" or "\r\n") in *l, *len; false at the end. */
bool df_next_line(struct df_lines *ls, const char **l, size_t *len);
bool df_blank_or_comment(const char *l, size_t n);
/* With b ending in the escape character and blanks: strips them and returns true. */
bool df_strip_continuation(struct df_sb *b, char esc);
/* A parser directive line "# key=value" (escape, syntax, check): 1 (it was one; escape sets
 * d->esc), 0 (not one: the directives end), -1 (an error). */
int df_directive(struct df *d, const char *l, size_t n, bool *seen_escape);

#endif
