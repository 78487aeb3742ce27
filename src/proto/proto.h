/* proto.h -- the guest protocol: length-prefixed frames of tagged fields over a unix stream socket
 *
 * moatd (host) connects to the sandbox's guest socket once per operation and sends one request
 * frame, optionally followed by DATA frames and an END frame (stdin of an exec, body of a file
 * write). The guest answers with frames until the operation ends, then closes the connection.
 *
 * Frame:  u32 little-endian length L (of what follows), u8 type, L-1 bytes of fields.
 * Field:  u16 LE tag, u32 LE length n, n bytes. Integers are fixed-width LE (u32/i32: 4 bytes,
 *         u64/i64: 8 bytes). Strings carry no NUL terminator and must not contain NUL.
 *
 * Exchanges (-> host to guest, <- guest to host):
 *   PING:   -> REQ_PING                                   <- REP_OK
 *   EXEC:   -> REQ_EXEC{ARGV+, ENV*, CWD?, USER?, TIMEOUT_MS?, MAX_OUTPUT?, STDIN_STREAM?}
 *           -> [DATA{DATA}* END]  (only when STDIN_STREAM=1; host may send them while reading)
 *           <- REP_STARTED{PID} (REP_STDOUT{DATA} | REP_STDERR{DATA})* REP_EXIT{...}
 *           or <- REP_ERROR{ERRNO, MESSAGE} before REP_STARTED (bad user, bad cwd, ...)
 *           A command that cannot be executed (not found) starts, prints the reason on stderr
 *           and exits 127, as a shell does.
 *   READ:   -> REQ_READ{PATH, USER?}    <- REP_OK{SIZE, MODE} DATA{DATA}* END   | REP_ERROR
 *   WRITE:  -> REQ_WRITE{PATH, USER?, MODE?}  <- REP_OK (parents made, ready)  | REP_ERROR
 *           -> DATA{DATA}* END                <- REP_OK{SIZE}                  | REP_ERROR
 *           The file is replaced atomically: written beside the target, renamed over it on END.
 *   REMOVE: -> REQ_REMOVE{PATH, USER?, RECURSIVE?}          <- REP_OK | REP_ERROR
 *   LIST:   -> REQ_LIST{PATH, USER?, DEPTH?}  <- REP_ENTRY{...}* END | REP_ERROR
 *   STAT:   -> REQ_STAT{PATH, USER?}          <- REP_ENTRY{...}      | REP_ERROR
 *   MKDIR:  -> REQ_MKDIR{PATH, USER?, PARENTS?, MODE?}      <- REP_OK | REP_ERROR (EEXIST)
 *   MOVE:   -> REQ_MOVE{PATH, PATH2, USER?}                 <- REP_OK | REP_ERROR
 *
 * Processes. Every process started by EXEC is owned by PID 1's process table until it
 * has exited and been listed/attached past its retention (the last 256 finished ones are kept).
 * Each keeps a ring buffer of its last 1 MiB per stream for replay.
 *   EXEC with BACKGROUND=1: <- REP_STARTED{PID} and the guest closes the connection; the process
 *           runs on. Without BACKGROUND the connection streams as above; KILL_ON_DISCONNECT (default
 *           1) says whether a dropped connection kills the process group before its exit. PTY_COLS
 *           and PTY_ROWS run it on a pseudo-terminal (one stream, REP_STDOUT). TAG names it.
 *           On any exec connection the host may send DATA (input) / END (close stdin) / REQ_RESIZE
 *           frames while output flows, whether or not STDIN_STREAM was set.
 *   ATTACH: -> REQ_ATTACH{PID | TAG, REPLAY?}  <- REP_PROC{...} then, when REPLAY=1, the retained
 *           output (REP_DROPPED{SIZE} first if the ring overflowed), then live REP_STDOUT/REP_STDERR
 *           and REP_EXIT (at once when it already exited). The host may send DATA/END/REQ_RESIZE.
 *           Closing an attach connection never kills the process. ESRCH: unknown pid or tag.
 *   STDIN:  -> REQ_STDIN{PID | TAG, DATA?, CLOSE?}             <- REP_OK | REP_ERROR (ESRCH, EPIPE)
 *   SIGNAL: -> REQ_SIGNAL{PID | TAG, SIGNAL}                   <- REP_OK | REP_ERROR (ESRCH, EINVAL)
 *   RESIZE: -> REQ_RESIZE{PID | TAG, PTY_COLS, PTY_ROWS}       <- REP_OK | REP_ERROR (ENOTTY, EINVAL)
 *   PROCS:  -> REQ_PROCS                     <- REP_PROC{...}* END
 *   REP_PROC = {PID, TAG?, ARGV+, STARTED_AT, RUNNING, EXIT_CODE?, SIGNAL?, PTY?, BACKGROUND?}
 *   WATCH:  -> REQ_WATCH{PATH, USER?, RECURSIVE?}  <- REP_OK, then REP_EVENT{EVENT, PATH, PATH2?}*
 *           until the host closes the connection (ENOTDIR / ENOENT as REP_ERROR instead of OK).
 *           EVENT is "create", "write", "remove", "rename" or "overflow".
 *   RENEW:  -> REQ_RENEW                      <- REP_OK once PID 1 runs as a fresh image
 *           After a restore: PID 1 hands its process table to a new exec of itself, so that its
 *           memory belongs to the sandbox's user namespace again (CRIU restores it into its own,
 *           the host's) and CRIU can dump it later while nothing inside can reach it. Processes,
 *           their output rings and tags carry over; open connections are closed.
 *   LOGS:   -> REQ_LOGS                       <- REP_OK, then until the host closes the connection:
 *           REP_PROC{...} once per process when it starts, REP_STDOUT{PID, TAG?, PTY?, STREAM,
 *           DATA} with its output, REP_DROPPED{PID, STREAM, SIZE} for bytes that left the ring
 *           before the log took them, REP_EXIT{PID, ...} after its last output. The log reads each
 *           process's rings behind what it already sent (a cursor per stream that RENEW keeps), so
 *           that a new LOGS connection (after a wake, a moatd restart) goes on where the last one
 *           stopped. A process whose log lags by half a ring waits while the host takes bytes;
 *           once the host takes none for 100 ms it runs on and the log loses what the ring
 *           overwrote, told by REP_DROPPED. One LOGS connection at a time: a new one ends the old.
 * Paths are absolute or relative to the user's home; they are resolved inside the sandbox's own
 * root, so ".." and symlinks cannot leave it. ERRNO is a Linux errno value.
 */
#ifndef MOAT_PROTO_H
#define MOAT_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/error.h"

#define MOAT_PROTO_MAX_FRAME (4u << 20) /* largest frame either side accepts */
#define MOAT_PROTO_CHUNK (256u << 10)   /* DATA frames carry at most this much */

enum moat_msg_type {
  MOAT_REQ_PING = 1,
  MOAT_REQ_EXEC = 2,
  MOAT_REQ_READ = 3,
  MOAT_REQ_WRITE = 4,
  MOAT_REQ_REMOVE = 5,
  MOAT_REQ_LIST = 6,
  MOAT_REQ_STAT = 7,
  MOAT_REQ_MKDIR = 8,
  MOAT_REQ_MOVE = 9,
  MOAT_REQ_ATTACH = 10,
  MOAT_REQ_STDIN = 11,
  MOAT_REQ_SIGNAL = 12,
  MOAT_REQ_RESIZE = 13,
  MOAT_REQ_PROCS = 14,
  MOAT_REQ_WATCH = 15,
  MOAT_REQ_RENEW = 16,
  MOAT_REQ_DEFAULTS = 17, /* USER and/or CWD that an EXEC without its own takes from now on (PID 1) */
  MOAT_REQ_LOGS = 18,     /* the output log of every process (see LOGS above) */

  MOAT_MSG_DATA = 20,
  MOAT_MSG_END = 21,

  MOAT_REP_OK = 30,
  MOAT_REP_ERROR = 31,
  MOAT_REP_STARTED = 32,
  MOAT_REP_STDOUT = 33,
  MOAT_REP_STDERR = 34,
  MOAT_REP_EXIT = 35,
  MOAT_REP_ENTRY = 36,
  MOAT_REP_PROC = 37,
  MOAT_REP_DROPPED = 38,
  MOAT_REP_EVENT = 39,
  MOAT_REP_ALIVE = 40, /* no fields: the guest is alive; any side skips it wherever it reads */
};

/* The guest sends REP_ALIVE on every connection it keeps open (process streams, watches) and
 * during long operations whenever it has sent nothing for this long, so that the host can tell
 * a quiet command from a guest that stopped answering. */
#define MOAT_PROTO_HEARTBEAT_MS 3000

enum moat_tag {
  MOAT_T_ARGV = 1,                /* string, repeated, in order */
  MOAT_T_ENV = 2,                 /* "KEY=VALUE", repeated; later ones win */
  MOAT_T_CWD = 3,                 /* string */
  MOAT_T_USER = 4,                /* user name inside the sandbox; absent = root */
  MOAT_T_TIMEOUT_MS = 5,          /* u32; 0 or absent = none */
  MOAT_T_MAX_OUTPUT = 6,          /* u64 bytes per stream kept; past it the stream is truncated */
  MOAT_T_PATH = 7,                /* string */
  MOAT_T_PATH2 = 8,               /* string (move destination) */
  MOAT_T_DATA = 9,                /* bytes */
  MOAT_T_MODE = 10,               /* u32 permission bits */
  MOAT_T_DEPTH = 11,              /* u32, list depth >= 1 */
  MOAT_T_RECURSIVE = 12,          /* u32 0/1 */
  MOAT_T_PARENTS = 13,            /* u32 0/1 */
  MOAT_T_ERRNO = 14,              /* i32 */
  MOAT_T_MESSAGE = 15,            /* string */
  MOAT_T_PID = 16,                /* i32 pid inside the sandbox */
  MOAT_T_EXIT_CODE = 17,          /* i32, -1 when killed by a signal */
  MOAT_T_SIGNAL = 18,             /* i32, 0 when exited normally */
  MOAT_T_TIMED_OUT = 19,          /* u32 0/1 */
  MOAT_T_STDOUT_TRUNC = 20,       /* u32 0/1 */
  MOAT_T_STDERR_TRUNC = 21,       /* u32 0/1 */
  MOAT_T_DURATION_MS = 22,        /* u64 */
  MOAT_T_NAME = 23,               /* string: entry's base name */
  MOAT_T_TYPE = 24,               /* u32: 'f' file, 'd' dir, 'l' symlink, 'o' other */
  MOAT_T_SIZE = 25,               /* u64 */
  MOAT_T_MTIME = 26,              /* i64 unix milliseconds */
  MOAT_T_UID = 27,                /* u32 */
  MOAT_T_GID = 28,                /* u32 */
  MOAT_T_LINK = 29,               /* string: symlink target */
  MOAT_T_STDIN_STREAM = 30,       /* u32 0/1 */
  MOAT_T_BACKGROUND = 31,         /* u32 0/1 */
  MOAT_T_TAG = 32,                /* string, [A-Za-z0-9_.-]{1,64}; unique among running processes */
  MOAT_T_PTY_COLS = 33,           /* u32 1..1000 */
  MOAT_T_PTY_ROWS = 34,           /* u32 1..1000 */
  MOAT_T_KILL_ON_DISCONNECT = 35, /* u32 0/1 */
  MOAT_T_REPLAY = 36,             /* u32 0/1 */
  MOAT_T_CLOSE = 37,              /* u32 0/1: close stdin after DATA */
  MOAT_T_STARTED_AT = 38,         /* i64 unix milliseconds */
  MOAT_T_RUNNING = 39,            /* u32 0/1 */
  MOAT_T_EVENT = 40,              /* string */
  MOAT_T_PTY = 41,                /* u32 0/1 */
  MOAT_T_STREAM = 42,             /* u32 LOGS: 0 stdout, 1 stderr (on a pty: its one stream) */
};

struct moat_msg {
  uint8_t type;
  uint8_t *buf; /* fields, owned */
  size_t len, cap;
};

struct moat_field {
  uint16_t tag;
  uint32_t len;
  const uint8_t *data;
};

/* Building. msg_init clears m; msg_reset keeps the buffer for reuse; msg_free releases it. */
void moat_msg_init(struct moat_msg *m, uint8_t type);
void moat_msg_reset(struct moat_msg *m, uint8_t type);
void moat_msg_free(struct moat_msg *m);
void moat_msg_put(struct moat_msg *m, uint16_t tag, const void *data, size_t len);
void moat_msg_put_str(struct moat_msg *m, uint16_t tag, const char *s);
void moat_msg_put_u32(struct moat_msg *m, uint16_t tag, uint32_t v);
void moat_msg_put_i32(struct moat_msg *m, uint16_t tag, int32_t v);
void moat_msg_put_u64(struct moat_msg *m, uint16_t tag, uint64_t v);
void moat_msg_put_i64(struct moat_msg *m, uint16_t tag, int64_t v);

/* Sends one frame (blocking, retries EINTR, MSG_NOSIGNAL on sockets). 0 or -1 with errno. */
int moat_msg_send(int fd, const struct moat_msg *m);
/* Sends a frame of one type and no fields / one DATA field. */
int moat_msg_send_empty(int fd, uint8_t type);
int moat_msg_send_data(int fd, uint8_t type, const void *data, size_t len);
/* The same on a socket written with MSG_DONTWAIT: whenever it takes nothing more, wait(ctx) is
 * called, which returns 0 to try again (after waiting for room) or -1 to give up with errno set.
 * A frame given up on may be partly sent: the connection is then unusable. */
int moat_msg_send_wait(int fd, const struct moat_msg *m, int (*wait)(void *ctx), void *ctx);
int moat_msg_send_data_wait(int fd, uint8_t type, const void *data, size_t len, int (*wait)(void *ctx),
                            void *ctx);
/* Sends REP_ALIVE if the socket takes it now (never blocks: a host that is not reading is not
 * waiting). 0 or -1. */
int moat_msg_send_alive(int fd);
/* Sends REP_ERROR{ERRNO=errnum, MESSAGE=formatted}. */
int moat_msg_send_error(int fd, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Receives one frame into m (replacing its contents). Returns 1 on a frame, 0 on clean EOF
 * before any byte, -1 on error (err set: EPROTO for malformed frames or fields). The fields are
 * validated: they tile the payload exactly. */
int moat_msg_recv(int fd, struct moat_msg *m, moat_error **err);

/* Parses a frame already in memory (used by recv and the fuzzer). Same contract as recv. */
int moat_msg_parse(const uint8_t *frame, size_t len, struct moat_msg *m, moat_error **err);

/* Iteration: start with *off = 0; returns true and fills f while fields remain. */
bool moat_msg_next(const struct moat_msg *m, size_t *off, struct moat_field *f);
/* First field with tag, or false. */
bool moat_msg_find(const struct moat_msg *m, uint16_t tag, struct moat_field *f);
/* Typed getters: 0 when found and well-formed, -1 otherwise (value untouched). */
int moat_msg_get_u32(const struct moat_msg *m, uint16_t tag, uint32_t *v);
int moat_msg_get_i32(const struct moat_msg *m, uint16_t tag, int32_t *v);
int moat_msg_get_u64(const struct moat_msg *m, uint16_t tag, uint64_t *v);
int moat_msg_get_i64(const struct moat_msg *m, uint16_t tag, int64_t *v);
/* Newly allocated NUL-terminated copy of a string field; NULL when absent or when it holds a
 * NUL byte. */
char *moat_msg_get_str(const struct moat_msg *m, uint16_t tag);
/* All string fields with tag as a NULL-terminated vector (empty vector when none); NULL when
 * any holds a NUL byte. */
char **moat_msg_get_strv(const struct moat_msg *m, uint16_t tag);

#endif
