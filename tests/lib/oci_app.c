/* oci_app.c -- a static program for the OCI images tests import (there is no shell in them).
 *   oci_app serve PORT   answers every TCP connection on 127.0.0.1:PORT with "hello from oci\n"
 *   oci_app get PORT     connects to 127.0.0.1:PORT and prints what it reads
 *   oci_app env          prints "uid=N cwd=DIR" and then the environment, a line each */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

extern char **environ;

static struct sockaddr_in addr(const char *port) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((unsigned short)atoi(port))};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return a;
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "serve") == 0) {
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    struct sockaddr_in a = addr(argv[2]);
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(s, 16) < 0) {
      perror("serve");
      return 1;
    }
    for (;;) {
      int c = accept(s, NULL, NULL);
      if (c < 0)
        continue;
      static const char msg[] = "hello from oci\n";
      if (write(c, msg, sizeof(msg) - 1) < 0)
        perror("write");
      close(c);
    }
  }
  if (argc == 3 && strcmp(argv[1], "get") == 0) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = addr(argv[2]);
    if (s < 0 || connect(s, (struct sockaddr *)&a, sizeof(a)) < 0) {
      perror("get");
      return 1;
    }
    char buf[256];
    ssize_t n;
    while ((n = read(s, buf, sizeof(buf))) > 0)
      fwrite(buf, 1, (size_t)n, stdout);
    return 0;
  }
  if (argc == 2 && strcmp(argv[1], "env") == 0) {
    char cwd[4096];
    printf("uid=%d cwd=%s\n", (int)getuid(), getcwd(cwd, sizeof(cwd)) ? cwd : "?");
    for (char **e = environ; *e; e++)
      printf("%s\n", *e);
    return 0;
  }
  fprintf(stderr, "usage: oci_app serve PORT | get PORT | env\n");
  return 2;
}
