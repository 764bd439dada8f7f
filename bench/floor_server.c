// bench/floor_server.c: the least a server can do per request on this kernel, as a reference
// point for bench/run.sh --floor. It is not an HTTP server: one epoll loop (level-triggered), and
// for each read, one send of a fixed 5-byte response per "\r\n\r\n" in what was read (so 16
// pipelined requests get one send), "Connection: close" honoured by closing after the send. No
// parsing, no allocation, no timers, no Date. Whatever CPU it spends per request is the kernel's
// TCP and epoll work plus a few hundred instructions: no real server can go below it with the
// same system calls.
//
//   cc -O2 -o floor_server bench/floor_server.c && ./floor_server PORT
#define _GNU_SOURCE  // accept4
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

#include "floor_common.h"

enum { kMaxBatch = 64 };

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: floor_server PORT\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  int one = 1;
  int lfd = floor_listen(argv[1], SOCK_NONBLOCK);
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
      int close_after;
      size_t len = floor_answers(in, out, kMaxBatch, &close_after);
      if (len == 0) continue;  // a request split across reads: not in this benchmark
      send(fd, out, len, MSG_NOSIGNAL);
      if (close_after) close(fd);
    }
  }
}
