/* guest_channel.c -- the linux driver's channel to its guests: a unix socket the sandbox's init
 * listens on in a directory the host owns, proven by SO_PEERCRED; a frozen cgroup says paused */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "../../common/log.h"
#include "../../common/util.h"
#include "shell.h"

/* Connects to ep and checks that the listener is the sandbox's init (SO_PEERCRED). The socket
 * stays blocking (the client's sends use MSG_DONTWAIT); SO_RCVTIMEO bounds a frame that stops
 * half-way. */
static int unix_connect(const struct moat_guest_ep *ep, unsigned timeout_ms, moat_error **err) {
  struct sockaddr_un sa = {.sun_family = AF_UNIX};
  size_t len = strnlen(ep->path, sizeof(ep->path));
  if (len == 0 || len >= sizeof(sa.sun_path))
    return moat_error_set(err, ECONNREFUSED, "sandbox guest: no socket path");
  memcpy(sa.sun_path, ep->path, len + 1);
  _cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return moat_error_errno(err, "socket");
  /* a full backlog makes connect wait: at most the guest timeout */
  struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
    if (errno == EINTR)
      continue;
    if (errno == EAGAIN || errno == EINPROGRESS)
      return moat_error_set(err, EHOSTUNREACH,
                            "sandbox guest did not answer for %u ms (its socket's backlog "
                            "stayed full)",
                            timeout_ms);
    int e = errno;
    return moat_error_set(err, ECONNREFUSED, "connect to sandbox guest: %s", strerror(e));
  }
  struct ucred cred;
  socklen_t cl = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) < 0)
    return moat_error_errno(err, "sandbox guest: SO_PEERCRED");
  if (cred.pid != ep->pid || cred.uid != ep->uid) {
    log_warn("guest socket %s: peer is pid %d uid %u, not the sandbox's init (pid %d uid %u): refused",
             ep->path, (int)cred.pid, (unsigned)cred.uid, (int)ep->pid, (unsigned)ep->uid);
    return moat_error_set(err, EPROTO, "sandbox guest: the socket's peer is not the sandbox's init");
  }
  return steal_fd(&fd);
}

/* True when the sandbox's cgroup reports frozen: paused or being checkpointed on purpose. */
static bool cgroup_frozen(const struct moat_guest_ep *ep) {
  if (!ep->frozen_path[0])
    return false;
  char buf[256];
  _cleanup_close_ int fd = open(ep->frozen_path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return false;
  ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0)
    return false;
  buf[n] = '\0';
  return strstr(buf, "frozen 1") != NULL;
}

const struct moat_guest_channel_ops moat_linux_guest_channel_ops = {.connect = unix_connect,
                                                                    .frozen = cgroup_frozen};
