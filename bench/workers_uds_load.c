// bench/workers_uds_load.c: a tiny closed-loop HTTP/1.1 load generator for a Unix stream socket
// (helper of workers.sh: wrk cannot connect to one). Single thread, epoll, N connections.
//
//   workers_uds_load SOCKET_PATH CONNECTIONS SECONDS close|keepalive [TARGET]
//
// close:     each request on a new connection with "Connection: close", read to EOF (what corral's
//            proxy does today, one upstream connection per request).
// keepalive: requests one after another on N persistent connections (what a pool would do).
// Prints: "requests N seconds S rps R errors E non200 M".
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

typedef struct {
  int fd;
  char buf[16384];
  size_t len;
} Conn;

static struct sockaddr_un addr;
static char request[512];
static size_t request_len;
static int keepalive;
static long requests, errors, non200;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int open_conn(int ep, Conn* c) {
  c->len = 0;
  c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (c->fd < 0) return -1;
  // Blocking connect (a full backlog waits rather than failing), then non-blocking I/O.
  if (connect(c->fd, (struct sockaddr*)&addr, sizeof addr) != 0) {
    close(c->fd);
    c->fd = -1;
    return -1;
  }
  fcntl(c->fd, F_SETFL, O_NONBLOCK);
  if (write(c->fd, request, request_len) != (ssize_t)request_len) {
    close(c->fd);
    c->fd = -1;
    return -1;
  }
  struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
  epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &ev);
  return 0;
}

static void finish(Conn* c) {
  requests++;
  if (c->len < 12 || memcmp(c->buf + 9, "200", 3) != 0) non200++;
}

// keepalive: is a whole response in the buffer? returns its length, or 0.
static size_t complete(Conn* c) {
  char* end = memmem(c->buf, c->len, "\r\n\r\n", 4);
  if (!end) return 0;
  size_t head = (size_t)(end - c->buf) + 4;
  size_t body = 0;
  char* cl = memmem(c->buf, head, "\r\nContent-Length:", 17);
  if (!cl) cl = memmem(c->buf, head, "\r\ncontent-length:", 17);
  if (cl) body = strtoul(cl + 17, NULL, 10);
  return c->len >= head + body ? head + body : 0;
}

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s SOCKET CONNECTIONS SECONDS close|keepalive [TARGET]\n", argv[0]);
    return 2;
  }
  addr.sun_family = AF_UNIX;
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", argv[1]);
  int n = atoi(argv[2]);
  double seconds = atof(argv[3]);
  keepalive = strcmp(argv[4], "keepalive") == 0;
  const char* target = argc > 5 ? argv[5] : "/";
  request_len = (size_t)snprintf(request, sizeof request,
                                 "GET %s HTTP/1.1\r\nHost: localhost\r\n%s\r\n", target,
                                 keepalive ? "" : "Connection: close\r\n");
  int ep = epoll_create1(EPOLL_CLOEXEC);
  Conn* conns = calloc((size_t)n, sizeof(Conn));
  for (int i = 0; i < n; i++)
    if (open_conn(ep, &conns[i]) != 0) errors++;
  double t0 = now(), deadline = t0 + seconds;
  struct epoll_event evs[256];
  while (now() < deadline) {
    int k = epoll_wait(ep, evs, 256, 100);
    for (int i = 0; i < k; i++) {
      Conn* c = evs[i].data.ptr;
      for (;;) {
        if (c->len == sizeof c->buf) c->len = 0;  // responses here are small; never expected
        ssize_t r = read(c->fd, c->buf + c->len, sizeof c->buf - c->len);
        if (r > 0) {
          c->len += (size_t)r;
          if (keepalive) {
            size_t used = complete(c);
            if (used) {
              finish(c);
              memmove(c->buf, c->buf + used, c->len - used);
              c->len -= used;
              if (write(c->fd, request, request_len) != (ssize_t)request_len) {
                errors++;
                goto reopen;
              }
            }
          }
          continue;
        }
        if (r < 0 && (errno == EAGAIN || errno == EINTR)) break;
        // EOF or error
        if (!keepalive && r == 0 && c->len > 0) finish(c);
        else errors++;
      reopen:
        close(c->fd);
        if (open_conn(ep, c) != 0) errors++;
        break;
      }
    }
  }
  double t = now() - t0;
  printf("requests %ld seconds %.3f rps %.0f errors %ld non200 %ld\n", requests, t, requests / t,
         errors, non200);
  return 0;
}
