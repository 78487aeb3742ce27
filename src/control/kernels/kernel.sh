# kernel.sh -- moat's bash code-context kernel: one persistent shell runs each cell with `.`
#
# Requests, one per line on stdin: {"id":"ID","code":"...","code_b64":"BASE64"} (the host always
# puts code_b64 last and uses ids of [A-Za-z0-9]). The cell's output goes out raw on the kernel's
# stdout and stderr; the end of a cell is a framed line "\x1e{json}\n" on both streams:
#   {"id","type":"end","execution_count":N,"exit_code":RC}
# SIGINT interrupts a running cell (its trap returns from the sourced cell with 130) and is
# ignored between cells. Variables, functions and the working directory persist; `exit` ends the
# context. Needs only bash and base64 (coreutils).
exec 3<&0 </dev/null
if [ -n "$1" ]; then
  cd "$1" || exit 2
fi
__moat_n=0
__moat_f=/run/moat/cell-$$.sh
# A context of an unprivileged user (E2B's, which run as "user") cannot write /run/moat.
if [ ! -w /run/moat ]; then
  __moat_f=$(mktemp /tmp/moat-cell-XXXXXX) || exit 2
fi
trap '' INT
while IFS= read -r __moat_line <&3; do
  __moat_id=${__moat_line#*\"id\":\"}
  __moat_id=${__moat_id%%\"*}
  __moat_b=${__moat_line##*\"code_b64\":\"}
  __moat_b=${__moat_b%%\"*}
  printf '%s' "$__moat_b" | base64 -d >"$__moat_f" 2>/dev/null
  # Optional env for this cell only: "env_b64" (sets) and "unenv_b64" (restores), before code_b64.
  __moat_pre= __moat_post=
  case $__moat_line in
  *'"env_b64":"'*)
    __moat_pre=${__moat_line#*\"env_b64\":\"}
    __moat_pre=${__moat_pre%%\"*}
    __moat_post=${__moat_line#*\"unenv_b64\":\"}
    __moat_post=${__moat_post%%\"*}
    ;;
  esac
  [ -n "$__moat_pre" ] && eval "$(printf '%s' "$__moat_pre" | base64 -d)"
  __moat_n=$((__moat_n + 1))
  trap 'trap "" INT; return 130' INT
  . "$__moat_f"
  __moat_rc=$?
  trap '' INT
  [ -n "$__moat_post" ] && eval "$(printf '%s' "$__moat_post" | base64 -d)"
  printf '\036{"id":"%s","type":"end","execution_count":%d,"exit_code":%d}\n' "$__moat_id" "$__moat_n" "$__moat_rc" >&2
  printf '\036{"id":"%s","type":"end","execution_count":%d,"exit_code":%d}\n' "$__moat_id" "$__moat_n" "$__moat_rc"
done
