/* nsconnect.c -- a TCP connection to a port on the loopback of another network namespace (a
 * sandbox's), made there: the socket is created inside the namespace and keeps it */
#include "net_internal.h"

#include <errno.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "../../common/util.h"

int moat_net_connect_port(int netns_fd, unsigned port, int timeout_ms, moat_error **err) {
  if (port == 0 || port > 65535)
    return moat_error_set(err, EINVAL, "port %u: must be 1 to 65535", port);
  int last = ECONNREFUSED;
  for (int i = 0; i < 2; i++) {
    int family = i == 0 ? AF_INET : AF_INET6;
    _cleanup_close_ int fd = net_socket_in(netns_fd, family, SOCK_STREAM, 0, err);
    if (fd < 0)
      return -1;
    struct timeval tv = {.tv_sec = timeout_ms / 1000, .tv_usec = (timeout_ms % 1000) * 1000};
    if (timeout_ms > 0)
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_storage ss = {0};
    socklen_t sl;
    if (family == AF_INET) {
      struct sockaddr_in *a = (struct sockaddr_in *)&ss;
      a->sin_family = AF_INET;
      a->sin_port = htons((uint16_t)port);
      a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      sl = sizeof(*a);
    } else {
      struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
      a->sin6_family = AF_INET6;
      a->sin6_port = htons((uint16_t)port);
      a->sin6_addr = in6addr_loopback;
      sl = sizeof(*a);
    }
    int rc;
    do
      rc = connect(fd, (struct sockaddr *)&ss, sl);
    while (rc < 0 && errno == EINTR);
    if (rc == 0) {
      struct timeval none = {0};
      setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &none, sizeof(none));
      return steal_fd(&fd);
    }
    if (errno == EINPROGRESS || errno == EAGAIN || errno == ETIMEDOUT)
      return moat_error_set(err, ETIMEDOUT, "connecting to port %u timed out", port);
    last = errno;
    if (errno != ECONNREFUSED && errno != EADDRNOTAVAIL && errno != ENETUNREACH && errno != EAFNOSUPPORT)
      break;
  }
  if (last == ECONNREFUSED || last == EADDRNOTAVAIL || last == ENETUNREACH || last == EAFNOSUPPORT)
    return moat_error_set(err, ECONNREFUSED, "nothing listens on port %u (127.0.0.1 or ::1)", port);
  errno = last;
  return moat_error_errno(err, "connect to port %u", port);
}
