/* gate.h -- moatd's front door: every client connection of the API and proxy listeners
 *
 * libmicrohttpd 0.9.75 runs each connection on a thread of its own and has only an inactivity
 * timeout, which a client trickling a byte every few seconds never trips; and it reads request
 * framing that RFC 9112 says to refuse (see framing.h). The gate keeps a record of every connection
 * (registered through MHD_OPTION_NOTIFY_CONNECTION) and:
 *   - looks at the bytes libmicrohttpd reads from each client before libmicrohttpd does: moatd
 *     defines recv(2), which libmicrohttpd calls for its client sockets, as recvfrom(2) followed by
 *     the framing judge for sockets the gate registered (any other socket passes untouched). A bad
 *     head or chunked body is answered with a JSON 400 by the gate itself and the connection closed,
 *     libmicrohttpd never seeing the bad head complete (a head pipelined behind requests still
 *     running is held back and answered once they have ended);
 *   - runs a watchdog thread that closes connections whose request head has not arrived within
 *     the header timeout (counted from the connection's accept for its first request, from the first
 *     byte of a head for later ones; answered 408), keep-alive connections idle for longer than the
 *     idle timeout, and, per org, the oldest idle keep-alive connections beyond max_idle_per_org (once idle 5
 * s);
 *   - knows which org each connection last served (api_gate_attribute) for that cap.
 * Connections busy with a request (from a complete head to the request's end), and upgraded ones,
 * are never closed by the gate.
 */
#ifndef MOAT_API_GATE_H
#define MOAT_API_GATE_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <microhttpd.h>

#include "../../common/error.h"

struct api_gate_config {
  unsigned header_timeout_s; /* a request head must arrive within this (> 0) */
  unsigned idle_timeout_s;   /* a keep-alive connection idle this long is closed (> 0) */
  unsigned max_idle_per_org; /* idle keep-alive connections an org may hold (> 0) */
};

/* Starts the watchdog with cfg, or (already started) counts one more user of it: each listener
 * starts and stops it once. 0, or -1 (no thread). */
int api_gate_start(const struct api_gate_config *cfg, moat_error **err);
void api_gate_stop(void);

/* The MHD_OPTION_NOTIFY_CONNECTION callback of a listener (cls: unused). */
void api_gate_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                     enum MHD_ConnectionNotificationCode toe);

/* At the first access-handler call of a request (it clears the connection's org). */
void api_gate_request(struct MHD_Connection *c);
/* The connection serves org now (org: an interned tag from fair.c that outlives the connection, or
 * NULL: no org, as after a request that was refused). */
void api_gate_attribute(struct MHD_Connection *c, const void *org);
/* A request of the connection has ended (the NOTIFY_COMPLETED callback). A connection whose
 * request headers asked for an Upgrade that did not happen is closed then (the gate stopped
 * reading its framing after that request). */
void api_gate_request_done(struct MHD_Connection *c);
/* The socket is handed to other code: an upgrade callback, or an error written by hand. The gate no
 * longer reads its bytes nor closes it. */
void api_gate_release(struct MHD_Connection *c);
/* The status the gate answered on the connection by itself (400 bad body, 408), or 0: for the
 * access log of a request that ended that way. */
unsigned api_gate_answered(struct MHD_Connection *c);

#endif
