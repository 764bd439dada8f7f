// bench/floor_server.c: the least a server can do per request on this kernel, as a reference
// point for bench/run.sh --floor. It is not an HTTP server: one epoll loop (level-triggered), and
// for each read, one send of a fixed 5-byte response per "\r\n\r\n" in what was read (so 16
// pipelined requests get one send), "Connection: close" honoured by closing after the send. No
// parsing, no allocation, no timers, no Date. Whatever CPU it spends per request is the kernel's
// TCP and epoll work plus a few hundred instructions: no real server can go below it with the
// same system calls.
//
//   cc -O2 -o floor_server bench/floor_server.c && ./floor_server PORT
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

// About the size of nginx's response head for the same request.
static const char kKeep[] =
    "HTTP/1.1 200 OK\r\nServer: floor\r\nDate: Mon, 30 Nov 2026 00:00:00 GMT\r\n"
    "Content-Type: text/plain\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello";
static const char kClose[] =
    "HTTP/1.1 200 OK\r\nServer: floor\r\nDate: Mon, 30 Nov 2026 00:00:00 GMT\r\n"
    "Content-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";

enum { kMaxBatch = 64 };

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: floor_server PORT\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)atoi(argv[1]));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(lfd, (struct sockaddr*)&a, sizeof a) < 0 || listen(lfd, 4096) < 0) {
    perror("floor_server: bind/listen");
    return 1;
  }
  int ep = epoll_create1(EPOLL_CLOEXEC);
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = lfd};
  epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
  static char in[65536];
  static char out[kMaxBatch * sizeof kKeep];
  struct epoll_event events[256];
  for (;;) {
    int n = epoll_wait(ep, events, 256, -1);
    for (int i = 0; i < n; ++i) {
      int fd = events[i].data.fd;
      if (fd == lfd) {
        int c;
        while ((c = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0) {
          setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          struct epoll_event cev = {.events = EPOLLIN | EPOLLRDHUP, .data.fd = c};
          epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
        }
        continue;
      }
      ssize_t r = read(fd, in, sizeof in - 1);
      if (r <= 0) {
        if (r < 0 && errno == EAGAIN) continue;
        close(fd);
        continue;
      }
      in[r] = '\0';
      int requests = 0;
      for (char* p = in; (p = strstr(p, "\r\n\r\n")) != NULL; p += 4) ++requests;
      if (requests == 0) continue;  // a request split across reads: not in this benchmark
      int close_after = strstr(in, "Connection: close") != NULL;
      const char* resp = close_after ? kClose : kKeep;
      size_t len = (close_after ? sizeof kClose : sizeof kKeep) - 1;
      if (requests > kMaxBatch) requests = kMaxBatch;
      for (int k = 0; k < requests; ++k) memcpy(out + (size_t)k * len, resp, len);
      send(fd, out, (size_t)requests * len, MSG_NOSIGNAL);
      if (close_after) close(fd);
    }
  }
}
