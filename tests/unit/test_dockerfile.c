/* test_dockerfile.c -- the Dockerfile parser (host/dockerfile.c): every instruction in its forms,
 * continuations, the escape directive, substitution, ENTRYPOINT/CMD, errors with their lines, cache
 * keys, and random input */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/util.h"
#include "host/dockerfile.h"

#include "tap.h"

static unsigned last_line;
static char last_err[512];

/* Parses text with build args "K=V" (NULL-terminated, or NULL); NULL on error (last_err, last_line). */
static struct moat_df_plan *parse_args(const char *text, const char *const *bargs) {
  struct moat_df_kv kv[16];
  size_t n = 0;
  char *own[16];
  for (; bargs && bargs[n]; n++) {
    own[n] = xstrdup(bargs[n]);
    char *eq = strchr(own[n], '=');
    *eq = '\0';
    kv[n] = (struct moat_df_kv){.key = own[n], .value = eq + 1};
  }
  moat_error *err = NULL;
  last_line = 12345;
  struct moat_df_plan *p = moat_dockerfile_parse(text, strlen(text), kv, n, &last_line, &err);
  snprintf(last_err, sizeof(last_err), "%s", err ? moat_error_msg(err) : "");
  if (!p && (!err || err->status != EINVAL))
    snprintf(last_err, sizeof(last_err), "(no EINVAL error)");
  moat_error_free(&err);
  for (size_t i = 0; i < n; i++)
    free(own[i]);
  return p;
}
static struct moat_df_plan *parse(const char *text) { return parse_args(text, NULL); }

/* argv joined with '|' (static buffer). */
static const char *j(char *const *v) {
  static char buf[4][1024];
  static int k;
  char *b = buf[k++ % 4];
  b[0] = '\0';
  if (!v)
    return "(null)";
  for (size_t i = 0; v[i]; i++)
    snprintf(b + strlen(b), 1024 - strlen(b), "%s%s", i ? "|" : "", v[i]);
  return b;
}

static const char *env_of(const struct moat_df_plan *p, const char *key) {
  size_t l = strlen(key);
  for (size_t i = 0; p->config.env[i]; i++)
    if (strncmp(p->config.env[i], key, l) == 0 && p->config.env[i][l] == '=')
      return p->config.env[i] + l + 1;
  return NULL;
}

/* Whether parsing fails with line and a message containing what. */
static bool fails_at(const char *text, unsigned line, const char *what) {
  struct moat_df_plan *p = parse(text);
  if (p) {
    moat_dockerfile_plan_free(p);
    return false;
  }
  char want[32];
  snprintf(want, sizeof(want), "line %u: ", line);
  return last_line == line && (line == 0 || strncmp(last_err, want, strlen(want)) == 0) &&
         strstr(last_err, what);
}
#define FAILS(text, line, what)                                                                              \
  CHECK(fails_at(text, line, what), "error at line %u (%s): %s", line, what, last_err)

static void test_basic(void) {
  struct moat_df_plan *p = parse("# a comment\n"
                                 "\n"
                                 "from base\n"
                                 "  RUN echo hi\n"
                                 "Run [\"/bin/echo\", \"exec\"]\n"
                                 "COPY a b /dst/\n"
                                 "ADD [\"x y\", \"/z\"]\n"
                                 "COPY --chown=app:grp --chmod=0755 s /d\n");
  if (!CHECK(p != NULL, "a plain Dockerfile parses: %s", last_err))
    return;
  CHECK(p->n_steps == 6, "6 steps: %zu", p->n_steps);
  CHECK(p->steps[0].kind == MOAT_DF_FROM && strcmp(p->steps[0].argv[0], "base") == 0 && p->steps[0].line == 3,
        "FROM base at line 3 (lower case name)");
  CHECK(strcmp(p->config.from, "base") == 0, "config.from");
  CHECK(p->steps[1].kind == MOAT_DF_RUN && p->steps[1].shell_form &&
            strcmp(j(p->steps[1].argv), "/bin/sh|-c|echo hi") == 0 && p->steps[1].line == 4,
        "RUN shell form: %s", j(p->steps[1].argv));
  CHECK(!p->steps[2].shell_form && strcmp(j(p->steps[2].argv), "/bin/echo|exec") == 0, "RUN exec form: %s",
        j(p->steps[2].argv));
  CHECK(p->steps[3].kind == MOAT_DF_COPY && strcmp(j(p->steps[3].argv), "a|b|/dst/") == 0 &&
            p->steps[3].argc == 3,
        "COPY two sources: %s", j(p->steps[3].argv));
  CHECK(p->steps[4].kind == MOAT_DF_ADD && strcmp(j(p->steps[4].argv), "x y|/z") == 0, "ADD JSON form: %s",
        j(p->steps[4].argv));
  CHECK(strcmp(p->steps[5].chown, "app:grp") == 0 && strcmp(p->steps[5].chmod, "0755") == 0 &&
            strcmp(j(p->steps[5].argv), "s|/d") == 0,
        "COPY --chown --chmod");
  CHECK(p->steps[0].changes_fs && p->steps[1].changes_fs && p->steps[3].wants_digest &&
            !p->steps[1].wants_digest,
        "changes_fs / wants_digest");
  CHECK(strcmp(p->steps[1].source, "RUN echo hi") == 0, "source kept for logs: %s", p->steps[1].source);
  CHECK(p->config.argv == NULL && p->config.exposed[0] == NULL && p->warnings[0] == NULL, "nothing else set");
  moat_dockerfile_plan_free(p);

  p = parse("FROM base\nRUN [ -f /etc/x ] && echo yes\n");
  CHECK(p && p->steps[1].shell_form && strcmp(p->steps[1].argv[2], "[ -f /etc/x ] && echo yes") == 0,
        "RUN [ -f ... ] is shell form, as in Docker");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base AS build\n");
  CHECK(p && strcmp(p->steps[0].stage, "build") == 0, "FROM ... AS name parsed");
  moat_dockerfile_plan_free(p);
}

static void test_continuations(void) {
  struct moat_df_plan *p = parse("FROM base\n"
                                 "RUN apt-get install \\\n"
                                 "    curl \\  \n"
                                 "# a comment inside\n"
                                 "\n"
                                 "    git\n"
                                 "COPY a \\\n b\n"
                                 "ENV A=1\n");
  if (!CHECK(p != NULL, "continuations parse: %s", last_err))
    return;
  CHECK(p->n_steps == 4, "4 steps: %zu", p->n_steps);
  CHECK(strcmp(p->steps[1].argv[2], "apt-get install     curl     git") == 0, "RUN joined: '%s'",
        p->steps[1].argv[2]);
  CHECK(p->steps[1].line == 2 && p->steps[2].line == 7 && p->steps[3].line == 9, "lines %u %u %u",
        p->steps[1].line, p->steps[2].line, p->steps[3].line);
  CHECK(strcmp(j(p->steps[2].argv), "a|b") == 0, "COPY over two lines");
  moat_dockerfile_plan_free(p);

  p = parse("FROM base\r\nRUN echo a \\\r\n b\r\n");
  CHECK(p && strcmp(p->steps[1].argv[2], "echo a  b") == 0, "CRLF line ends: '%s'",
        p ? p->steps[1].argv[2] : "");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nRUN echo \\");
  CHECK(p && strcmp(p->steps[1].argv[2], "echo") == 0,
        "a continuation at the end of the file ends the instruction");
  moat_dockerfile_plan_free(p);
}

static void test_escape(void) {
  struct moat_df_plan *p = parse("# syntax=docker/dockerfile:1\n"
                                 "# escape=`\n"
                                 "FROM base\n"
                                 "COPY c:\\src `\n"
                                 "  c:\\dst\n"
                                 "ENV P=`$HOME\n");
  if (!CHECK(p != NULL, "escape=` parses: %s", last_err))
    return;
  CHECK(p->escape == '`', "escape is `");
  CHECK(strcmp(j(p->steps[1].argv), "c:\\src|c:\\dst") == 0, "backslashes are literal, ` continues: %s",
        j(p->steps[1].argv));
  CHECK(strcmp(env_of(p, "P"), "$HOME") == 0, "`$ is a literal $: %s", env_of(p, "P"));
  moat_dockerfile_plan_free(p);

  p = parse("FROM base\n# escape=`\nCOPY a\\ b /d\n");
  CHECK(p && p->escape == '\\' && strcmp(j(p->steps[1].argv), "a b|/d") == 0,
        "a directive after an instruction is a comment; \\ escapes a blank");
  moat_dockerfile_plan_free(p);
  p = parse("# unknown=1\n# escape=`\nFROM base\n");
  CHECK(p && p->escape == '\\', "an unknown directive ends the directives");
  moat_dockerfile_plan_free(p);
  FAILS("# escape=x\nFROM base\n", 1, "invalid escape");
  FAILS("# escape=`\n# escape=\\\nFROM base\n", 2, "only one escape");
}

static void test_env_label_arg(void) {
  struct moat_df_plan *p = parse("FROM base\n"
                                 "ENV A=1 B=\"two words\" C='$A'\n"
                                 "ENV D $A and $B\n"
                                 "ENV A=x E=$A\n"
                                 "LABEL org.x=\"y z\" \"quoted key\"=v\n"
                                 "LABEL legacy value here\n"
                                 "LABEL org.x=again\n");
  if (!CHECK(p != NULL, "ENV/LABEL parse: %s", last_err))
    return;
  CHECK(strcmp(env_of(p, "A"), "x") == 0 && strcmp(env_of(p, "B"), "two words") == 0, "ENV k=v, quoted");
  CHECK(strcmp(env_of(p, "C"), "$A") == 0, "single quotes: no substitution");
  CHECK(strcmp(env_of(p, "D"), "1 and two words") == 0, "legacy ENV k v: '%s'", env_of(p, "D"));
  CHECK(strcmp(env_of(p, "E"), "1") == 0, "pairs of one ENV see the values from before it: E=%s",
        env_of(p, "E"));
  CHECK(strcmp(j(p->config.env), "A=x|B=two words|C=$A|D=1 and two words|E=1") == 0, "env order: %s",
        j(p->config.env));
  CHECK(p->config.n_labels == 3 && strcmp(p->config.labels[0].value, "again") == 0 &&
            strcmp(p->config.labels[1].key, "quoted key") == 0 &&
            strcmp(p->config.labels[2].value, "value here") == 0,
        "LABEL pairs, quoted key, legacy, later wins");
  moat_dockerfile_plan_free(p);

  const char *const bargs[] = {"V=passed", "NOPE=1", "HTTP_PROXY=http://p:3128", NULL};
  p = parse_args("ARG TAG=1.0\n"
                 "ARG V\n"
                 "FROM base:${TAG}\n"
                 "RUN echo $TAG\n"
                 "ARG TAG\n"
                 "ARG W=dflt V\n"
                 "ENV W=env\n"
                 "RUN echo\n"
                 "WORKDIR /$TAG/$V/$W\n",
                 bargs);
  if (!CHECK(p != NULL, "ARG parses: %s", last_err))
    return;
  CHECK(strcmp(p->config.from, "base:1.0") == 0, "ARG before FROM used in FROM: %s", p->config.from);
  CHECK(strcmp(j(p->steps[1].env), "HTTP_PROXY=http://p:3128") == 0,
        "a global ARG is not in scope after FROM until re-declared (RUN env: %s)", j(p->steps[1].env));
  CHECK(strcmp(j(p->steps[5].env), "W=env|TAG=1.0|V=passed|HTTP_PROXY=http://p:3128") == 0,
        "RUN env: ENV, then ARGs (build arg overrides, ENV shadows), proxy passed: %s", j(p->steps[5].env));
  CHECK(strcmp(p->steps[6].argv[0], "/1.0/passed/env") == 0, "WORKDIR substituted: %s", p->steps[6].argv[0]);
  CHECK(p->warnings[0] && strstr(p->warnings[0], "NOPE") && !p->warnings[1],
        "an undeclared build arg is a warning, the proxy is not: %s", j(p->warnings));
  CHECK(strcmp(j(p->config.env), "W=env") == 0, "ARGs are not in the image's env");
  moat_dockerfile_plan_free(p);
}

static void test_substitution(void) {
  struct moat_df_plan *p =
      parse("FROM base\n"
            "ENV SET=v EMPTY=\n"
            "ENV A=${UNSET}x B=${UNSET:-dflt} C=${SET:-dflt} D=${EMPTY:-e} E=${EMPTY-e}\n"
            "ENV F=${SET:+alt} G=${UNSET:+alt} H=\\$SET I=\"\\$SET\" J=$ K=$SET$SET\n"
            "ENV L=${UNSET:-${SET}-nested} M=\"a b $SET\" N=$SET.ext O=${SET+plus}\n");
  if (!CHECK(p != NULL, "substitutions parse: %s", last_err))
    return;
  static const char *const want[][2] = {{"A", "x"},     {"B", "dflt"},  {"C", "v"},   {"D", "e"},
                                        {"E", ""},      {"F", "alt"},   {"G", ""},    {"H", "$SET"},
                                        {"I", "$SET"},  {"J", "$"},     {"K", "vv"},  {"L", "v-nested"},
                                        {"M", "a b v"}, {"N", "v.ext"}, {"O", "plus"}};
  int bad = 0;
  for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
    const char *got = env_of(p, want[i][0]);
    if (!got || strcmp(got, want[i][1]) != 0) {
      printf("# %s = '%s', want '%s'\n", want[i][0], got ? got : "(unset)", want[i][1]);
      bad++;
    }
  }
  CHECK(bad == 0, "unset, defaults (:- and -), alternatives, escaped \\$, lone $, nested: %d wrong", bad);
  moat_dockerfile_plan_free(p);

  p = parse("FROM base\nENV X=y\nRUN echo $X\nCMD echo $X\n");
  CHECK(p && strcmp(p->steps[2].argv[2], "echo $X") == 0 && strcmp(p->config.cmd[2], "echo $X") == 0,
        "RUN and CMD are not substituted (the shell does it)");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nENV PORTS=\"80 443/udp\"\nEXPOSE $PORTS 8080\n");
  CHECK(p && strcmp(j(p->config.exposed), "80/tcp|443/udp|8080/tcp") == 0,
        "EXPOSE splits an unquoted substitution: %s", p ? j(p->config.exposed) : "");
  moat_dockerfile_plan_free(p);
  FAILS("FROM base\nENV A=${UNSET:?must be set}\n", 2, "UNSET: must be set");
  FAILS("FROM base\nENV A=${X\n", 2, "bad substitution");
  FAILS("FROM base\nENV A=${X/a/b}\n", 2, "unsupported modifier");
  FAILS("FROM base\nENV A=\"open\n", 2, "unterminated double quote");
  FAILS(
      "FROM base\nENV A=${A:-${A:-${A:-${A:-${A:-${A:-${A:-${A:-${A:-${A:-${A:-${A:-${A:-${A:-${A:-${A:-${A:-"
      "x}}}}}}}}}}}}}}}}}\n",
      2, "nested deeper");
  /* Doubling a value stops at the bound, with an error, not at memory's end. */
  {
    struct sb_like {
      char *p;
      size_t n;
    } t = {xstrdup("FROM base\nENV A=0123456789abcdef\n"), 0};
    for (int i = 0; i < 14; i++) {
      char *n = xasprintf("%sENV A=$A$A\n", t.p);
      free(t.p);
      t.p = n;
    }
    CHECK(fails_at(t.p, 14, "over 65536 bytes"),
          "a value doubled past the bound (A= and 2^12 x 16 bytes): %s", last_err);
    free(t.p);
  }
}

static void test_workdir_user_expose(void) {
  struct moat_df_plan *p = parse("FROM base\n"
                                 "WORKDIR /app\n"
                                 "WORKDIR src/../lib//x/.\n"
                                 "RUN pwd\n"
                                 "USER app:staff\n"
                                 "COPY f .\n"
                                 "EXPOSE 80 53/udp 9000-9002/TCP 80/tcp\n"
                                 "STOPSIGNAL SIGTERM\n"
                                 "VOLUME /data /cache\n"
                                 "VOLUME [\"/json\"]\n"
                                 "MAINTAINER someone <a@b>\n");
  if (!CHECK(p != NULL, "WORKDIR/USER/EXPOSE/... parse: %s", last_err))
    return;
  CHECK(strcmp(p->config.workdir, "/app/lib/x") == 0, "relative WORKDIR joined and cleaned: %s",
        p->config.workdir);
  CHECK(strcmp(p->steps[3].workdir, "/app/lib/x") == 0 && p->steps[3].user == NULL, "RUN sees the workdir");
  CHECK(strcmp(p->config.user, "app:staff") == 0 && strcmp(p->steps[5].user, "app:staff") == 0,
        "USER user:group");
  CHECK(strcmp(j(p->steps[6].argv), "80/tcp|53/udp|9000-9002/tcp|80/tcp") == 0, "EXPOSE step normalised: %s",
        j(p->steps[6].argv));
  CHECK(strcmp(j(p->config.exposed), "53/udp|80/tcp|9000/tcp|9001/tcp|9002/tcp") == 0,
        "exposed ports: sorted, ranges expanded, no repeats: %s", j(p->config.exposed));
  CHECK(strcmp(p->config.stopsignal, "SIGTERM") == 0, "STOPSIGNAL recorded");
  CHECK(strcmp(j(p->config.volumes), "/data|/cache|/json") == 0, "VOLUME both forms: %s",
        j(p->config.volumes));
  CHECK(strcmp(p->config.maintainer, "someone <a@b>") == 0, "MAINTAINER recorded");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nWORKDIR ../../..\n");
  CHECK(p && strcmp(p->config.workdir, "/") == 0, "WORKDIR never climbs above /");
  moat_dockerfile_plan_free(p);
  FAILS("FROM base\nEXPOSE 70000\n", 2, "EXPOSE: not a port");
  FAILS("FROM base\nEXPOSE 80/icmp\n", 2, "EXPOSE: not a port");
  FAILS("FROM base\nEXPOSE 90-80\n", 2, "EXPOSE: not a port");
  FAILS("FROM base\nUSER a b\n", 2, "USER needs one word");
  FAILS("FROM base\nSTOPSIGNAL 99\n", 2, "not a signal");
}

static void test_entrypoint_cmd(void) {
  struct moat_df_plan *p = parse("FROM base\nCMD [\"a\", \"b\"]\n");
  CHECK(p && strcmp(j(p->config.argv), "a|b") == 0 && p->config.cmd_set && !p->config.entrypoint_set,
        "CMD exec form alone");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nENTRYPOINT [\"/srv\", \"--port\"]\nCMD [\"8080\"]\n");
  CHECK(p && strcmp(j(p->config.argv), "/srv|--port|8080") == 0, "CMD as ENTRYPOINT's args: %s",
        p ? j(p->config.argv) : "");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nCMD [\"8080\"]\nENTRYPOINT [\"/srv\"]\n");
  CHECK(p && strcmp(j(p->config.argv), "/srv|8080") == 0,
        "a CMD before the ENTRYPOINT in the same file is kept");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nENTRYPOINT python -m http.server\nCMD [\"ignored\"]\n");
  CHECK(p && strcmp(j(p->config.argv), "/bin/sh|-c|python -m http.server|ignored") == 0 &&
            p->steps[1].shell_form,
        "shell-form ENTRYPOINT: sh -c text, then CMD (as Docker: $0 of the shell): %s",
        p ? j(p->config.argv) : "");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nCMD one\nCMD [\"two\"]\nENTRYPOINT [\"e1\"]\nENTRYPOINT [\"e2\"]\n");
  CHECK(p && strcmp(j(p->config.argv), "e2|two") == 0, "a later CMD and ENTRYPOINT override: %s",
        p ? j(p->config.argv) : "");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nSHELL [\"/bin/bash\", \"-o\", \"pipefail\", \"-c\"]\nRUN a | b\nCMD serve\n");
  CHECK(p && strcmp(j(p->steps[2].argv), "/bin/bash|-o|pipefail|-c|a | b") == 0 &&
            strcmp(j(p->config.argv), "/bin/bash|-o|pipefail|-c|serve") == 0 &&
            strcmp(j(p->config.shell), "/bin/bash|-o|pipefail|-c") == 0,
        "SHELL applies to later shell forms");
  moat_dockerfile_plan_free(p);

  /* Merging with a base image's config. */
  char *bep[] = {"/base-ep", NULL}, *bcmd[] = {"base-cmd", NULL};
  p = parse("FROM base\nENV A=1\n");
  char **a = moat_dockerfile_start_argv(&p->config, bep, bcmd);
  CHECK(strcmp(j(a), "/base-ep|base-cmd") == 0, "neither set: the base's");
  strv_free(a);
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nENTRYPOINT [\"/mine\"]\n");
  a = moat_dockerfile_start_argv(&p->config, bep, bcmd);
  CHECK(strcmp(j(a), "/mine") == 0, "an ENTRYPOINT drops the base's CMD: %s", j(a));
  strv_free(a);
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nCMD [\"x\"]\n");
  a = moat_dockerfile_start_argv(&p->config, bep, bcmd);
  CHECK(strcmp(j(a), "/base-ep|x") == 0, "a CMD over the base's ENTRYPOINT: %s", j(a));
  strv_free(a);
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nENTRYPOINT []\n");
  a = moat_dockerfile_start_argv(&p->config, bep, bcmd);
  CHECK(a == NULL && p->config.entrypoint_set, "ENTRYPOINT [] clears it");
  strv_free(a);
  moat_dockerfile_plan_free(p);
}

static void test_healthcheck(void) {
  struct moat_df_plan *p =
      parse("FROM base\nHEALTHCHECK --interval=5s --timeout=1m30s --start-period=500ms --retries=5 "
            "CMD curl -f http://localhost/ || exit 1\n");
  if (!CHECK(p != NULL, "HEALTHCHECK parses: %s", last_err))
    return;
  struct moat_df_health *h = &p->config.health;
  CHECK(h->set && !h->none && h->shell_form && h->interval_ms == 5000 && h->timeout_ms == 90000 &&
            h->start_period_ms == 500 && h->retries == 5 && h->start_interval_ms == 5000,
        "options: %llu %llu %llu %u", (unsigned long long)h->interval_ms, (unsigned long long)h->timeout_ms,
        (unsigned long long)h->start_period_ms, h->retries);
  CHECK(strcmp(j(h->test), "/bin/sh|-c|curl -f http://localhost/ || exit 1") == 0, "shell-form test: %s",
        j(h->test));
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nhealthcheck CMD [\"/probe\", \"$X\"]\n");
  CHECK(p && strcmp(j(p->config.health.test), "/probe|$X") == 0 && p->config.health.interval_ms == 30000 &&
            p->config.health.retries == 3,
        "exec-form test, no substitution, defaults");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nHEALTHCHECK CMD true\nHEALTHCHECK NONE\n");
  CHECK(p && p->config.health.none && p->config.health.test == NULL, "HEALTHCHECK NONE overrides");
  moat_dockerfile_plan_free(p);
  FAILS("FROM base\nHEALTHCHECK --interval=fast CMD true\n", 2, "not a duration");
  FAILS("FROM base\nHEALTHCHECK --retries=0 CMD true\n", 2, "--retries");
  FAILS("FROM base\nHEALTHCHECK --interval=1s NONE\n", 2, "NONE takes no flags");
  FAILS("FROM base\nHEALTHCHECK true\n", 2, "CMD command or NONE");
  FAILS("FROM base\nENV ${A:-x y}\n", 2, "needs a value");
}

static void test_errors(void) {
  FAILS("FROM base\nRUN ok\nFOO bar\n", 3, "unknown instruction FOO");
  FAILS("FROM base\n\n\nONBUILD RUN x\n", 4, "ONBUILD is not supported");
  FAILS("FROM base\nRUN [\"echo\", \"hi\"\n", 2, "JSON array does not parse");
  FAILS("FROM base\nCMD [\"echo\", 1]\n", 2, "not a string");
  FAILS("FROM base\nRUN echo\nFROM other\n", 3,
        "multi-stage builds are not supported (the first FROM is on line 1)");
  FAILS("FROM base\nCOPY --from=build /a /b\n", 2, "COPY --from is not supported");
  FAILS("FROM base\nADD --from=x a b\n", 2, "ADD --from is not supported");
  FAILS("FROM\n", 1, "FROM needs an image");
  FAILS("ARG X\nFROM ${X}\n", 2, "an empty image name");
  FAILS("FROM base\nRUN --mount=type=cache,target=/x make\n", 2, "RUN --mount is not supported");
  FAILS("FROM base\nRUN --network=none make\n", 2, "RUN --network is not supported");
  FAILS("FROM base\nRUN --bogus make\n", 2, "unknown flag --bogus");
  FAILS("FROM --platform=linux/arm64 base\n", 1, "--platform is not supported");
  FAILS("RUN echo\nFROM base\n", 1, "RUN before FROM");
  FAILS("# only a comment\n", 0, "no instructions");
  FAILS("ARG A=1\n", 0, "no FROM");
  FAILS("FROM base\nCOPY onlyone\n", 2, "a source and a destination");
  FAILS("FROM base\nCOPY a b /notdir\n", 2, "ending with /");
  {
    struct moat_df_plan *p = parse("FROM base\nCOPY a b .\nCOPY c d /x/.\n");
    CHECK(p != NULL, "COPY of two sources into . or /x/. (a directory as Docker reads it): %s", last_err);
    moat_dockerfile_plan_free(p);
  }
  FAILS("FROM base\nADD https://example.com/x.tgz /x\n", 2, "ADD of a URL");
  FAILS("FROM base\nCOPY --chmod=u+x a b\n", 2, "octal mode");
  FAILS("FROM base\nRUN <<EOF\necho\nEOF\n", 2, "heredocs");
  FAILS("FROM base\nSHELL /bin/bash -c\n", 2, "SHELL takes a JSON array");
  FAILS("FROM base\nENV\n", 2, "ENV needs key=value");
  FAILS("FROM base\nENV ONLYKEY\n", 2, "needs a value");
  FAILS("FROM base\nENV A=1 B\n", 2, "not key=value");
  FAILS("FROM base\nRUN\n", 2, "RUN needs a command");
  FAILS("FROM base\nRUN []\n", 2, "RUN needs a command");
  FAILS("FROM base\nWORKDIR\n", 2, "WORKDIR needs an argument");
  FAILS("FROM base\nARG 1bad\n", 2, "not a valid name");
  FAILS("FROM base\n9RUN x\n", 2, "not an instruction");
  {
    const char text[] = "FROM base\nRUN a\0b\n";
    moat_error *err = NULL;
    unsigned line = 0;
    struct moat_df_plan *p = moat_dockerfile_parse(text, sizeof(text) - 1, NULL, 0, &line, &err);
    CHECK(!p && line == 2 && err && strstr(err->msg, "NUL"), "a NUL byte is refused with its line: %s",
          err ? err->msg : "");
    moat_error_free(&err);
  }
  /* Bounds. */
  {
    size_t n = MOAT_DF_MAX_SIZE + 1;
    char *big = xmalloc(n + 1);
    memset(big, '#', n);
    big[n] = '\0';
    moat_error *err = NULL;
    unsigned line = 99;
    struct moat_df_plan *p = moat_dockerfile_parse(big, n, NULL, 0, &line, &err);
    CHECK(!p && line == 0 && err && strstr(err->msg, "over"), "a text over the size bound: %s",
          err ? err->msg : "");
    moat_error_free(&err);
    free(big);
  }
  {
    size_t n = MOAT_DF_MAX_LINE + 100;
    char *big = xmalloc(n + 32);
    strcpy(big, "FROM base\nRUN ");
    memset(big + strlen(big), 'x', n);
    big[14 + n] = '\0';
    CHECK(fails_at(big, 2, "over 65536 bytes"), "an instruction over the line bound: %s", last_err);
    free(big);
  }
  {
    size_t n = MOAT_DF_MAX_STEPS + 2;
    char *big = xmalloc(n * 8 + 16);
    strcpy(big, "FROM base\n");
    for (size_t i = 1; i < n; i++)
      strcat(big, "RUN x\n");
    CHECK(fails_at(big, MOAT_DF_MAX_STEPS + 1, "more than 512 instructions"), "instruction count bound: %s",
          last_err);
    free(big);
  }
  {
    char *big = xmalloc(8 * (MOAT_DF_MAX_WORDS + 2) + 32);
    strcpy(big, "FROM base\nCMD [");
    for (int i = 0; i <= MOAT_DF_MAX_WORDS; i++)
      strcat(big, i ? ",\"a\"" : "\"a\"");
    strcat(big, "]\n");
    CHECK(fails_at(big, 2, "more than 1024 elements"), "JSON array bound: %s", last_err);
    free(big);
  }
}

static struct moat_df_plan *keys_of(const char *text, char keys[][65], size_t max) {
  struct moat_df_plan *p = parse(text);
  for (size_t i = 0; p && i < p->n_steps && i < max; i++)
    memcpy(keys[i], p->steps[i].key_hex, 65);
  return p;
}

static void test_cache_keys(void) {
  char a[8][65], b[8][65];
  struct moat_df_plan *pa =
      keys_of("FROM base\nENV A=1 B=2\nRUN make\nCOPY src /app/\nRUN make install\n", a, 8);
  struct moat_df_plan *pb = keys_of("# a comment\n\nfrom   base  \n  ENV A=1   B=2\nrun make   \n"
                                    "COPY \\\n   src  /app/\n\nRUN  make install\n",
                                    b, 8);
  bool same = pa && pb && pa->n_steps == 5 && pb->n_steps == 5;
  for (size_t i = 0; same && i < 5; i++)
    same = strcmp(a[i], b[i]) == 0;
  CHECK(same, "keys stable across comments, blank lines, case, indentation and blanks between words");
  CHECK(pa && strlen(a[0]) == 64 && strcmp(a[0], a[1]) != 0,
        "keys are 64 hex characters and differ per step");
  moat_dockerfile_plan_free(pb);

  pb = keys_of("FROM base\nENV A=1 B=2\nRUN make\nCOPY src /app/\nRUN make check\n", b, 8);
  CHECK(pb && strcmp(a[3], b[3]) == 0 && strcmp(a[4], b[4]) != 0,
        "a change to the last line keeps every earlier key");
  moat_dockerfile_plan_free(pb);
  pb = keys_of("FROM base\nENV A=1 B=3\nRUN make\nCOPY src /app/\nRUN make install\n", b, 8);
  bool all_differ = pb != NULL;
  for (size_t i = 1; all_differ && i < 5; i++)
    all_differ = strcmp(a[i], b[i]) != 0;
  CHECK(pb && strcmp(a[0], b[0]) == 0 && all_differ,
        "a change to an earlier step changes it and every later key");
  moat_dockerfile_plan_free(pb);
  pb = keys_of("FROM base\nENV A=1 B=2\nRUN make  \nCOPY src /app/\nRUN make install\n", b, 8);
  CHECK(pb && strcmp(a[2], b[2]) == 0, "trailing blanks do not count");
  moat_dockerfile_plan_free(pb);
  pb = keys_of("FROM base\nENV A=1 B=2\nRUN  make\nCOPY src /app/\nRUN make install\n", b, 8);
  CHECK(pb && strcmp(a[2], b[2]) == 0, "blanks between RUN and its command do not count");
  moat_dockerfile_plan_free(pb);
  pb = keys_of("FROM base\nENV A=1 B=2\nRUN make  -j2\nCOPY src /app/\nRUN make install\n", b, 8);
  struct moat_df_plan *pc =
      keys_of("FROM base\nENV A=1 B=2\nRUN make -j2\nCOPY src /app/\nRUN make install\n", a, 8);
  CHECK(pb && pc && strcmp(a[2], b[2]) != 0, "blanks inside a shell command count (the shell sees them)");
  moat_dockerfile_plan_free(pb);
  moat_dockerfile_plan_free(pc);

  /* The content hook. */
  uint8_t d1[32], d2[32];
  memset(d1, 1, 32);
  memset(d2, 2, 32);
  char before[5][65];
  for (int i = 0; i < 5; i++)
    memcpy(before[i], pa->steps[i].key_hex, 65);
  moat_error *err = NULL;
  CHECK(moat_dockerfile_plan_set_digest(pa, 3, d1, &err) == 0 && pa->steps[3].has_digest,
        "digest set on COPY");
  CHECK(strcmp(before[2], pa->steps[2].key_hex) == 0 && strcmp(before[3], pa->steps[3].key_hex) != 0 &&
            strcmp(before[4], pa->steps[4].key_hex) != 0,
        "the COPY's digest changes its key and later ones only");
  char with1[65];
  memcpy(with1, pa->steps[4].key_hex, 65);
  moat_dockerfile_plan_set_digest(pa, 3, d2, NULL);
  CHECK(strcmp(with1, pa->steps[4].key_hex) != 0, "other content, other keys");
  moat_dockerfile_plan_set_digest(pa, 3, d1, NULL);
  CHECK(strcmp(with1, pa->steps[4].key_hex) == 0, "the same content, the same keys");
  CHECK(moat_dockerfile_plan_set_digest(pa, 2, d1, &err) < 0 && err && err->status == EINVAL,
        "a RUN takes no digest");
  moat_error_free(&err);
  CHECK(moat_dockerfile_plan_set_digest(pa, 99, d1, &err) < 0, "no step 99");
  moat_error_free(&err);
  moat_dockerfile_plan_set_digest(pa, 0, d2, NULL);
  CHECK(strcmp(before[0], pa->steps[0].key_hex) != 0, "FROM takes the base's digest");
  moat_dockerfile_plan_free(pa);

  /* Build args: used in a RUN's env changes its key; passing one nothing declares does not. */
  const char *const v1[] = {"V=1", NULL}, *const v2[] = {"V=2", NULL};
  pa = parse_args("FROM base\nARG V\nCOPY a /a\nRUN make\n", v1);
  pb = parse_args("FROM base\nARG V\nCOPY a /a\nRUN make\n", v2);
  CHECK(pa && pb && strcmp(pa->steps[2].key_hex, pb->steps[2].key_hex) == 0 &&
            strcmp(pa->steps[3].key_hex, pb->steps[3].key_hex) != 0,
        "an ARG's value misses the cache at the RUN that sees it, not before");
  moat_dockerfile_plan_free(pa);
  moat_dockerfile_plan_free(pb);
  const char *const proxy[] = {"HTTP_PROXY=http://a", NULL};
  pa = parse("FROM base\nRUN make\n");
  pb = parse_args("FROM base\nRUN make\n", proxy);
  CHECK(pa && pb && strcmp(pa->steps[1].key_hex, pb->steps[1].key_hex) == 0 && pb->steps[1].env[0],
        "a proxy build arg reaches RUN and not its key");
  moat_dockerfile_plan_free(pa);
  moat_dockerfile_plan_free(pb);
}

static void test_random(void) {
  static const char *const pieces[] = {"FROM base\n",
                                       "RUN x\n",
                                       "COPY a b\n",
                                       "ENV A=$A${B:-c}\n",
                                       "\\\n",
                                       "[\"",
                                       "\"]",
                                       "${",
                                       "}",
                                       "'",
                                       "\"",
                                       "# escape=`\n",
                                       "ARG A\n",
                                       "EXPOSE 1-9\n",
                                       "HEALTHCHECK CMD x\n",
                                       "--from=x ",
                                       "\n",
                                       " ",
                                       "`",
                                       "$",
                                       "=",
                                       "WORKDIR ../a\n",
                                       "LABEL a=b\n",
                                       "CMD [\"a\"]\n",
                                       "ENTRYPOINT x\n",
                                       "SHELL [\"a\"]\n",
                                       "VOLUME a\n",
                                       "\r"};
  int crashes = 0, parsed = 0;
  uint8_t rnd[512];
  for (int it = 0; it < 3000; it++) {
    random_bytes(rnd, sizeof(rnd));
    char text[2048];
    size_t n = 0;
    if (it % 2 == 0) {
      memcpy(text, rnd, 400);
      n = 400;
    } else {
      for (int k = 0; k < 40 && n < 1800; k++) {
        const char *pc = pieces[rnd[k] % (sizeof(pieces) / sizeof(pieces[0]))];
        size_t l = strlen(pc);
        memcpy(text + n, pc, l);
        n += l;
      }
    }
    moat_error *err = NULL;
    unsigned line = 0;
    struct moat_df_plan *p = moat_dockerfile_parse(text, n, NULL, 0, &line, &err);
    if (p) {
      parsed++;
      if (err || !p->n_steps || !p->config.from || strlen(p->steps[p->n_steps - 1].key_hex) != 64)
        crashes++;
    } else if (!err || err->status != EINVAL || !err->msg) {
      crashes++;
    }
    moat_error_free(&err);
    moat_dockerfile_plan_free(p);
  }
  CHECK(crashes == 0, "3000 random inputs: each a plan or an EINVAL error (%d parsed), %d inconsistent",
        parsed, crashes);
}

/* The Dockerfile of the integration test to come: every instruction once. */
static void test_every_instruction(void) {
  static const char text[] = "# syntax=docker/dockerfile:1\n"
                             "ARG BASE=base\n"
                             "FROM ${BASE} AS app\n"
                             "LABEL org.opencontainers.image.title=\"demo app\" version=1\n"
                             "ENV APP_HOME=/app PORT=8080\n"
                             "ARG MODE=release\n"
                             "WORKDIR $APP_HOME\n"
                             "SHELL [\"/bin/bash\", \"-o\", \"pipefail\", \"-c\"]\n"
                             "RUN apt-get update \\\n"
                             "    && apt-get install -y curl \\\n"
                             "# a comment inside\n"
                             "    && rm -rf /var/lib/apt/lists/*\n"
                             "COPY --chown=app:app --chmod=0644 requirements.txt ./\n"
                             "ADD [\"vendor.tar\", \"/opt/\"]\n"
                             "COPY src/ lib/ ${APP_HOME}/\n"
                             "USER app\n"
                             "EXPOSE ${PORT} 53/udp\n"
                             "VOLUME [\"/data\"]\n"
                             "STOPSIGNAL SIGINT\n"
                             "HEALTHCHECK --interval=5s CMD curl -fsS http://localhost:${PORT}/ || exit 1\n"
                             "ENTRYPOINT [\"python3\", \"-m\", \"http.server\"]\n"
                             "CMD [\"8080\"]\n";
  const char *const bargs[] = {"MODE=debug", NULL};
  struct moat_df_plan *p = parse_args(text, bargs);
  if (!CHECK(p != NULL, "a Dockerfile with every instruction parses: %s", last_err))
    return;
  static const enum moat_df_kind kinds[] = {
      MOAT_DF_FROM,       MOAT_DF_LABEL,  MOAT_DF_ENV,    MOAT_DF_ARG,        MOAT_DF_WORKDIR,
      MOAT_DF_SHELL,      MOAT_DF_RUN,    MOAT_DF_COPY,   MOAT_DF_ADD,        MOAT_DF_COPY,
      MOAT_DF_USER,       MOAT_DF_EXPOSE, MOAT_DF_VOLUME, MOAT_DF_STOPSIGNAL, MOAT_DF_HEALTHCHECK,
      MOAT_DF_ENTRYPOINT, MOAT_DF_CMD};
  bool same = p->n_steps == sizeof(kinds) / sizeof(kinds[0]);
  for (size_t i = 0; same && i < p->n_steps; i++)
    same = p->steps[i].kind == kinds[i];
  CHECK(same, "17 steps of the right kinds (the ARG before FROM is none): %zu", p->n_steps);
  CHECK(strcmp(p->config.from, "base") == 0 && strcmp(p->steps[0].stage, "app") == 0, "FROM ${BASE} AS app");
  CHECK(strcmp(j(p->steps[6].argv),
               "/bin/bash|-o|pipefail|-c|apt-get update     && apt-get install -y curl     "
               "&& rm -rf /var/lib/apt/lists/*") == 0 &&
            p->steps[6].line == 9 && strcmp(p->steps[6].workdir, "/app") == 0,
        "RUN under SHELL, continued past a comment, in /app: %s", j(p->steps[6].argv));
  CHECK(strcmp(j(p->steps[6].env), "APP_HOME=/app|PORT=8080|MODE=debug") == 0,
        "RUN env with the build arg: %s", j(p->steps[6].env));
  CHECK(strcmp(j(p->steps[9].argv), "src/|lib/|/app/") == 0 && p->steps[7].line == 13 &&
            p->steps[9].line == 15,
        "COPY destinations substituted; lines after the continuation");
  CHECK(strcmp(j(p->config.exposed), "53/udp|8080/tcp") == 0 && strcmp(p->config.user, "app") == 0 &&
            strcmp(p->config.stopsignal, "SIGINT") == 0 && strcmp(j(p->config.volumes), "/data") == 0,
        "config: ports, user, stop signal, volumes");
  CHECK(strcmp(j(p->config.argv), "python3|-m|http.server|8080") == 0, "start command: %s",
        j(p->config.argv));
  CHECK(strcmp(j(p->config.health.test),
               "/bin/bash|-o|pipefail|-c|curl -fsS http://localhost:${PORT}/ || exit 1") == 0 &&
            p->config.health.interval_ms == 5000,
        "HEALTHCHECK under SHELL, not substituted: %s", j(p->config.health.test));
  CHECK(strcmp(p->config.labels[0].value, "demo app") == 0 && p->config.n_labels == 2, "labels");
  moat_dockerfile_plan_free(p);
}

static void test_more_substitution(void) {
  const char *const bargs[] = {"TAG=2.0", "U=svc", NULL};
  struct moat_df_plan *p = parse_args("ARG TAG=1.0\n"
                                      "ARG IMG=base:${TAG}\n"
                                      "FROM $IMG\n"
                                      "ARG U=nobody\n"
                                      "ARG D=${U}-data\n"
                                      "COPY --chown=${U}:${U} [\"it's \\\"here\\\"\", \"$D/\"]\n"
                                      "COPY --chown=$U \"a b\" 'c d' /dst/\n",
                                      bargs);
  if (!CHECK(p != NULL, "substitution in ARG defaults, FROM, --chown: %s", last_err))
    return;
  CHECK(strcmp(p->config.from, "base:2.0") == 0,
        "a build arg overrides a global ARG, seen by a later default: %s", p->config.from);
  CHECK(strcmp(p->steps[3].chown, "svc:svc") == 0 &&
            strcmp(j(p->steps[3].argv), "it's \"here\"|svc-data/") == 0,
        "--chown substituted; a JSON element keeps its quotes: %s %s", p->steps[3].chown,
        j(p->steps[3].argv));
  CHECK(strcmp(p->steps[4].chown, "svc") == 0 && strcmp(j(p->steps[4].argv), "a b|c d|/dst/") == 0,
        "quoted sources with blanks: %s", j(p->steps[4].argv));
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nENV A=\"${UNSET:-a b}\" B=${UNSET:-c d}\n");
  CHECK(p && strcmp(env_of(p, "A"), "a b") == 0 && strcmp(env_of(p, "B"), "c d") == 0,
        "a default with blanks stays in its pair");
  moat_dockerfile_plan_free(p);
  p = parse("FROM base\nENV A=1\nENV B=\"$A\" C='$A' D=\\${A}\n");
  CHECK(p && strcmp(env_of(p, "B"), "1") == 0 && strcmp(env_of(p, "C"), "$A") == 0 &&
            strcmp(env_of(p, "D"), "${A}") == 0,
        "double quotes substitute, single quotes and \\${ do not");
  moat_dockerfile_plan_free(p);
}

int main(void) {
  test_basic();
  test_continuations();
  test_escape();
  test_env_label_arg();
  test_substitution();
  test_more_substitution();
  test_workdir_user_expose();
  test_entrypoint_cmd();
  test_healthcheck();
  test_errors();
  test_cache_keys();
  test_every_instruction();
  test_random();
  return tap_done();
}
