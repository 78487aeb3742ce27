/* main.c -- the moat CLI: the command table and dispatch */
#include <stdio.h>
#include <string.h>

#include "../common/version.h"
#include "cli.h"

struct command {
  const char *name;
  int (*fn)(int argc, char **argv);
  const char *summary;
};

static const struct command commands[] = {
    {"create", cmd_create, "create a sandbox, print its id"},
    {"ls", cmd_ls, "list sandboxes"},
    {"get", cmd_get, "show one sandbox as JSON"},
    {"exec", cmd_exec, "run a command in a sandbox; its exit code passes through"},
    {"ps", cmd_ps, "list a sandbox's processes"},
    {"attach", cmd_attach, "follow a process's output (replayed from its start) until it exits"},
    {"kill", cmd_kill, "send a signal to a process of a sandbox"},
    {"logs", cmd_logs, "a sandbox's log: every process's output, starts, exits, lifecycle (-f follows)"},
    {"shell", cmd_shell, "a terminal in a sandbox (PTY over WebSocket)"},
    {"cp", cmd_cp, "copy a file into (ID:PATH as DST) or out of (ID:PATH as SRC) a sandbox"},
    {"rm", cmd_rm, "kill sandboxes"},
    {"run", cmd_run, "create a sandbox, run a command (or --python CODE), kill it"},
    {"template", cmd_template,
     "template build NAME [-f DOCKERFILE] [DIR] | import NAME FILE | logs | get | ls | rm"},
    {"volume", cmd_volume, "volume create NAME --size MB | volume ls | volume rm NAME..."},
    {"org", cmd_org, "org create NAME | ls | get ID | rm ID... [--force]   (platform admin key)"},
    {"quota", cmd_quota, "quota get ORG | quota set ORG NAME=VALUE..."},
    {"usage", cmd_usage,
     "the org's metered CPU and memory over a range, grouped; usage now ORG: use against quotas"},
    {"metrics", cmd_metrics, "a sandbox's resource use now, or its recorded samples (--from/--to)"},
    {"db", cmd_db, "db create NAME | ls | get ID | branch ID NAME | rm ID... | url ID | psql ID [-- ARGS]"},
    {"pause", cmd_pause, "freeze sandboxes (no CPU, memory kept, TTL stopped)"},
    {"resume", cmd_resume, "thaw paused sandboxes"},
    {"hibernate", cmd_hibernate, "write sandboxes to disk and release their memory"},
    {"wake", cmd_wake, "bring hibernated sandboxes back"},
    {"snapshot", cmd_snapshot, "snapshot a running sandbox (memory, processes, files), print its id"},
    {"snapshots", cmd_snapshots, "snapshots [ls [--sandbox ID]] | get SID | rm SID..."},
    {"fork", cmd_fork, "fork a sandbox into N children, print their ids"},
    {"rollback", cmd_rollback, "return a sandbox to one of its snapshots, in place"},
    {"explore", cmd_explore, "fork once per command, run them, keep the winner"},
    {"fs", cmd_fs, "fs ls|stat|mkdir|mv|rm|watch ID PATH...: a sandbox's files"},
    {"stdin", cmd_stdin, "send data to a background process's stdin (--close: then EOF)"},
    {"resize", cmd_resize, "resize a background process's terminal"},
    {"update", cmd_update, "change a sandbox's TTL, persistence or metadata"},
    {"context", cmd_context, "context create ID | ls ID | run ID CID CODE | restart ID CID | rm ID CID..."},
    {"port", cmd_port, "port ls ID | get ID PORT | expose ID PORT [--public|--token T] | rm ID PORT"},
    {"network", cmd_network, "network get ID | set ID [--internet on|off] [--allow E]... | log ID"},
    {"events", cmd_events, "follow a sandbox's events (state, connections, OOM kills) as JSON lines"},
    {"keys", cmd_keys, "keys ls | create NAME [--role R] [--expires T] | rm KID..."},
    {"me", cmd_me, "the calling API key and its org"},
    {"host", cmd_host, "the host: capacity, load, sandboxes, checkpoints (moatd's view)"},
    {"audit", cmd_audit, "the org's audit log, one JSON entry a line"},
};

static void usage(FILE *f) {
  fputs("usage: moat COMMAND [ARGS...]   (moat COMMAND --help for its options)\n\ncommands:\n", f);
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
    fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].summary);
  fputs("\n  moat help COMMAND   that command's options; moat --version   the CLI's version\n", f);
  fputs("\nenvironment:\n"
        "  MOAT_API_URL   moatd's address (default http://127.0.0.1:7070)\n"
        "  MOAT_API_KEY   API key (default: the content of ./.moat/api-key)\n",
        f);
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return EXIT_USAGE;
  }
  if (strcmp(argv[1], "--version") == 0 || strcmp(argv[1], "version") == 0) {
    printf("moat %s\n", MOAT_VERSION);
    return 0;
  }
  /* moat help COMMAND: that command's own --help */
  char *help_argv[] = {argv[0], argc > 2 ? argv[2] : NULL, "--help", NULL};
  if (strcmp(argv[1], "help") == 0 && argc > 2) {
    argc = 3;
    argv = help_argv;
  } else if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
    if (strcmp(argv[1], commands[i].name) != 0)
      continue;
    cli_client_init();
    int r = commands[i].fn(argc - 1, argv + 1);
    cli_client_cleanup();
    if (fflush(stdout) != 0 && r == 0)
      r = EXIT_API;
    return r;
  }
  fprintf(stderr, "moat: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return EXIT_USAGE;
}
