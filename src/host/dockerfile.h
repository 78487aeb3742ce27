/* dockerfile.h -- a Dockerfile's parser and its build plan: the steps with their arguments expanded
 * and their cache keys, and the image config the steps leave behind. Pure: reads only the text and
 * build args it is given, does no I/O.
 *
 * The syntax is that of `docker build` (BuildKit's default frontend), single stage:
 * - parser directives at the top (`# escape=\` or `` # escape=` ``; `# syntax=` and `# check=` are
 *   read and ignored); comment lines (`#` first on the line) and blank lines anywhere, also inside a
 *   continuation; a line ending in the escape character (then blanks) continues on the next one;
 *   instruction names in any case; `--flag[=value]` words right after the instruction name.
 * - FROM image [AS name], RUN, COPY, ADD, ENV (`k=v ...` and the legacy `k v`), ARG (before FROM
 *   too: usable in FROM, and in the stage once re-declared without a value), WORKDIR (relative to
 *   the previous one), USER, EXPOSE (port, port/proto, range), LABEL, ENTRYPOINT, CMD, HEALTHCHECK
 *   (CMD or NONE; --interval --timeout --start-period --start-interval --retries), SHELL (JSON),
 *   STOPSIGNAL, VOLUME, MAINTAINER (recorded, as Docker's Author).
 * - RUN/CMD/ENTRYPOINT/HEALTHCHECK CMD in shell form (run as SHELL + [text]) or JSON exec form.
 *   Text that starts with `["` or `[]` must be a JSON array of strings: Docker runs it as a shell
 *   command when it is not, here it is an error (a typo every time). Other text that starts with
 *   '[' (`RUN [ -f x ] && ...`) is shell form, as in Docker.
 * - Variables from ENV and ARG (ENV wins over ARG) are substituted in FROM, ADD, COPY (and their
 *   --chown/--chmod), ENV, EXPOSE, LABEL, USER, WORKDIR, ARG, STOPSIGNAL, VOLUME: $VAR, ${VAR},
 *   ${VAR:-word} ${VAR-word} ${VAR:+word} ${VAR+word} ${VAR:?msg} ${VAR?msg}; an escaped `\$` is a
 *   `$`; nothing in single quotes. An unset variable is empty. The pairs of one ENV/LABEL see the
 *   values from before the instruction. RUN, CMD, ENTRYPOINT, SHELL, HEALTHCHECK are not
 *   substituted (the shell does it). In EXPOSE an unquoted substitution splits into words. In
 *   the JSON form of COPY/ADD an element is substituted but its quotes and escapes are its own.
 *
 * Refused, each with the line number and a message naming what: a second FROM (multi-stage),
 * COPY/ADD --from, --link, --parents, --exclude, ADD --checksum/--keep-git-dir, ADD of a URL or a
 * git repository, RUN --mount/--network/--security, FROM --platform, heredocs (`<<EOF`), ONBUILD,
 * any other instruction or flag, an instruction other than ARG before FROM, no FROM, an empty FROM,
 * a JSON array that does not parse or holds a non-string, a bound below exceeded, a NUL byte.
 *
 * Bounds: MOAT_DF_MAX_SIZE bytes of text, MOAT_DF_MAX_LINE bytes in one instruction (continuations
 * joined) and in any expanded value, MOAT_DF_MAX_STEPS instructions, MOAT_DF_MAX_WORDS words or
 * JSON array elements in one instruction, MOAT_DF_MAX_VARS ENV + ARG names, MOAT_DF_MAX_BUILD_ARGS
 * build args, MOAT_DF_MAX_DEPTH nested ${...}, MOAT_DF_MAX_PORTS exposed ports.
 */
#ifndef MOAT_HOST_DOCKERFILE_H
#define MOAT_HOST_DOCKERFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/error.h"
#include "../common/sha256.h"

#define MOAT_DF_MAX_SIZE (1024 * 1024)
#define MOAT_DF_MAX_LINE (64 * 1024)
#define MOAT_DF_MAX_STEPS 512
#define MOAT_DF_MAX_WORDS 1024
#define MOAT_DF_MAX_VARS 512
#define MOAT_DF_MAX_BUILD_ARGS 128
#define MOAT_DF_MAX_DEPTH 16
#define MOAT_DF_MAX_PORTS 1024
#define MOAT_DF_MAX_WARNINGS 64

enum moat_df_kind {
  MOAT_DF_FROM,
  MOAT_DF_RUN,
  MOAT_DF_COPY,
  MOAT_DF_ADD,
  MOAT_DF_ENV,
  MOAT_DF_ARG,
  MOAT_DF_WORKDIR,
  MOAT_DF_USER,
  MOAT_DF_EXPOSE,
  MOAT_DF_LABEL,
  MOAT_DF_ENTRYPOINT,
  MOAT_DF_CMD,
  MOAT_DF_HEALTHCHECK,
  MOAT_DF_SHELL,
  MOAT_DF_STOPSIGNAL,
  MOAT_DF_VOLUME,
  MOAT_DF_MAINTAINER,
};

/* The instruction's name in upper case ("RUN"). */
const char *moat_df_kind_name(enum moat_df_kind k);

struct moat_df_kv {
  char *key;
  char *value; /* ARG: NULL when declared without a value and none was passed */
};

struct moat_df_health {
  bool set;        /* a HEALTHCHECK was given */
  bool none;       /* HEALTHCHECK NONE: the base image's check is disabled */
  bool shell_form; /* test is SHELL + [text] */
  char **test;     /* argv of the check, NULL-terminated; NULL with none */
  uint64_t interval_ms, timeout_ms, start_period_ms,
      start_interval_ms; /* Docker's defaults: 30 s, 30 s, 0, 5 s */
  unsigned retries;      /* default 3 */
};

/* One instruction (the ARGs before FROM are none: steps[0] is the FROM). Strings are owned by the
 * plan. */
struct moat_df_step {
  enum moat_df_kind kind;
  unsigned line; /* 1-based line the instruction starts on */
  char *source;  /* the instruction as written, continuations joined (for build logs) */
  char **argv;   /* NULL-terminated, expanded:
                  *   FROM [image]; RUN the command (shell form: SHELL + [text]); COPY/ADD the sources
                  *   then the destination last, as written: every source is a path in
                  *   the context (Docker takes "/x" and "../x" as the context's x: the builder
                  *   resolves them inside it and expands wildcards), a relative destination is in
                  *   workdir; WORKDIR [absolute cleaned path]; USER
                  *   [user[:group]]; EXPOSE ["80/tcp", ...]; ENTRYPOINT/CMD the argv it sets;
                  *   HEALTHCHECK the test (empty with NONE); SHELL the shell; STOPSIGNAL [sig];
                  *   VOLUME the paths; MAINTAINER [name]; ENV/LABEL/ARG: empty (see kv) */
  size_t argc;
  bool shell_form;       /* RUN/ENTRYPOINT/CMD/HEALTHCHECK written in shell form */
  char *stage;           /* FROM ... AS name: the name, else NULL */
  char *chown, *chmod;   /* COPY/ADD --chown/--chmod, expanded, else NULL */
  struct moat_df_kv *kv; /* ENV, LABEL, ARG: the pairs, expanded, in order */
  size_t n_kv;
  char **env;        /* RUN: the environment it runs with ("K=V": ENV, then ARGs in scope) */
  char *workdir;     /* the working directory in effect ("/" until a WORKDIR) */
  char *user;        /* the user in effect (NULL: the base image's) */
  bool changes_fs;   /* FROM, RUN, COPY, ADD, WORKDIR: the builder makes a layer */
  bool wants_digest; /* FROM, COPY, ADD: the key is incomplete until the digest is set */
  bool has_digest;
  uint8_t digest[MOAT_SHA256_LEN]; /* set by moat_dockerfile_plan_set_digest */
  char *canon;                     /* the canonical text hashed into the key (fields NUL-separated) */
  size_t canon_len;
  uint8_t key[MOAT_SHA256_LEN]; /* SHA-256 of the parent step's key (zeros for FROM), canon,
                                 * and the digest when set */
  char key_hex[2 * MOAT_SHA256_LEN + 1];
};

/* The config the image gets, as far as this Dockerfile sets it (the base image's is the builder's
 * to merge: see moat_dockerfile_start_argv). */
struct moat_df_config {
  char *from;                /* the base image, expanded */
  char **env;                /* "K=V", NULL-terminated, in the order first set */
  char *workdir;             /* NULL: no WORKDIR */
  char *user;                /* NULL: no USER */
  char **entrypoint;         /* NULL when no ENTRYPOINT */
  char **cmd;                /* NULL when no CMD (an ENTRYPOINT keeps a CMD given here, before or after it) */
  bool entrypoint_set;       /* an ENTRYPOINT was given (its argv may be empty: ENTRYPOINT []) */
  bool cmd_set;              /* a CMD was given */
  char **argv;               /* the start command, entrypoint ++ cmd as Docker combines them, for a base
                              * image with neither; NULL when both are unset or empty */
  char **exposed;            /* "80/tcp", sorted, without repeats */
  struct moat_df_kv *labels; /* in the order first set, a later value replacing */
  size_t n_labels;
  struct moat_df_health health;
  char **shell;     /* the SHELL in effect at the end (["/bin/sh", "-c"] by default) */
  char *stopsignal; /* NULL unless STOPSIGNAL */
  char **volumes;   /* VOLUME paths, NULL-terminated (empty when none) */
  char *maintainer; /* NULL unless MAINTAINER */
};

struct moat_df_plan {
  struct moat_df_step *steps;
  size_t n_steps;
  struct moat_df_config config;
  char **warnings; /* NULL-terminated: build args passed and never declared, ... */
  char escape;     /* the escape character in effect ('\\' or '`') */
};

/* Parses text[0..len) with the build args args[0..n_args) (override ARG defaults; one never
 * declared is a warning in the plan; HTTP_PROXY, HTTPS_PROXY, FTP_PROXY, NO_PROXY, ALL_PROXY and
 * their lower-case forms are passed to RUN without a declaration, and left out of cache keys, as
 * Docker does). Returns the plan (the caller frees it with moat_dockerfile_plan_free), or NULL with
 * *err set (status EINVAL, the message "line N: ..." when tied to a line) and *err_line (when not
 * NULL) set to that line, 0 when the error is not tied to one (too large, no instructions). */
struct moat_df_plan *moat_dockerfile_parse(const char *text, size_t len, const struct moat_df_kv *args,
                                           size_t n_args, unsigned *err_line, moat_error **err);

void moat_dockerfile_plan_free(struct moat_df_plan *plan);

/* The content hook: sets the digest of step i (FROM: the base image's identity, e.g. the digest
 * of its root; COPY/ADD: the digest of the sources' content, names and modes, as the builder
 * reads them from the context) and recomputes the key of step i and of every later step. A step
 * whose digest was never set has a key from its text alone, which the builder must not use to
 * look up its cache. 0, or -1 (EINVAL: i out of range or a step that takes no digest). */
int moat_dockerfile_plan_set_digest(struct moat_df_plan *plan, size_t i,
                                    const uint8_t digest[MOAT_SHA256_LEN], moat_error **err);

/* The start command Docker runs for this config over a base image whose config has base_entrypoint
 * and base_cmd (each NULL-terminated, or NULL): an ENTRYPOINT here replaces the base's and, unless
 * a CMD is given here too, drops the base's CMD; a CMD here replaces the base's; the result is
 * entrypoint ++ cmd. Returns a new NULL-terminated argv (strv_free), NULL when it is empty. */
char **moat_dockerfile_start_argv(const struct moat_df_config *c, char *const *base_entrypoint,
                                  char *const *base_cmd);

#endif
