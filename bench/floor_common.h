// What bench/floor_server.c and bench/floor_uring.c share: the fixed responses, the listening
// socket, and the one thing they look at in what they read.
#pragma once

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

// About the size of nginx's response head for the same request.
static const char kKeep[] =
    "HTTP/1.1 200 OK\r\nServer: floor\r\nDate: Mon, 30 Nov 2026 00:00:00 GMT\r\n"
    "Content-Type: text/plain\r\nContent-Length: 5\r\nConnection: keep-alive\r\n\r\nhello";
static const char kClose[] =
    "HTTP/1.1 200 OK\r\nServer: floor\r\nDate: Mon, 30 Nov 2026 00:00:00 GMT\r\n"
    "Content-Type: text/plain\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";

// A socket listening on 127.0.0.1:port (`flags` adds SOCK_NONBLOCK or not); exits on failure.
static int floor_listen(const char* port, int flags) {
  int one = 1;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | flags, 0);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)atoi(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr*)&a, sizeof a) < 0 || listen(fd, 4096) < 0) {
    perror("floor: bind/listen");
    exit(1);
  }
  return fd;
}

// Writes into `out` one response per request ("\r\n\r\n") in the NUL-terminated `in`, at most
// `max`; returns the bytes written (0: no whole request yet) and sets *close_after.
static size_t floor_answers(const char* in, char* out, int max, int* close_after) {
  int requests = 0;
  for (const char* p = in; (p = strstr(p, "\r\n\r\n")) != NULL; p += 4) ++requests;
  if (requests > max) requests = max;
  *close_after = strstr(in, "Connection: close") != NULL;
  const char* resp = *close_after ? kClose : kKeep;
  size_t len = (*close_after ? sizeof kClose : sizeof kKeep) - 1;
  for (int k = 0; k < requests; ++k) memcpy(out + (size_t)k * len, resp, len);
  return (size_t)requests * len;
}
