// bench/floor_uring.c: bench/floor_server.c's twin on io_uring (raw system calls, no liburing):
// the same non-server (a fixed 5-byte response per "\r\n\r\n" read, "Connection: close"
// honoured, no parsing), but the reads and sends of every ready connection are submitted and
// reaped in batches with one io_uring_enter, where the epoll floor makes one read and one send
// system call per connection. It answers one question for bench/run.sh --floor: how much of the
// kernel's per-request cost a batching interface removes on this machine.
//
//   cc -O2 -o floor_uring bench/floor_uring.c && ./floor_uring PORT
#define _GNU_SOURCE  // accept4
#include <errno.h>
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "floor_common.h"

enum { kEntries = 4096, kMaxFd = 65536, kInSize = 4096, kMaxBatch = 32 };
enum { kAccept = 1, kRecv = 2, kSend = 3 };

struct conn {
  char in[kInSize];
  char out[kMaxBatch * sizeof kKeep];
  int close_after;
};
static struct conn* conns;

static int ring_fd;
static unsigned *sq_head, *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
static struct io_uring_sqe* sqes;
static struct io_uring_cqe* cqes;
static unsigned to_submit;

static struct io_uring_sqe* get_sqe(void) {
  unsigned tail = *sq_tail;  // only we write it
  unsigned head = __atomic_load_n(sq_head, __ATOMIC_ACQUIRE);
  if (tail - head >= kEntries) {
    fprintf(stderr, "floor_uring: submission queue full\n");  // not with this benchmark's load
    exit(1);
  }
  unsigned i = tail & *sq_mask;
  sq_array[i] = i;
  struct io_uring_sqe* sqe = &sqes[i];
  memset(sqe, 0, sizeof *sqe);
  __atomic_store_n(sq_tail, tail + 1, __ATOMIC_RELEASE);
  ++to_submit;
  return sqe;
}

static uint64_t tag(int kind, int fd) { return ((uint64_t)kind << 32) | (uint32_t)fd; }

static void submit_recv(int fd) {
  struct io_uring_sqe* s = get_sqe();
  s->opcode = IORING_OP_RECV;
  s->fd = fd;
  s->addr = (uint64_t)(uintptr_t)conns[fd].in;
  s->len = kInSize - 1;
  s->user_data = tag(kRecv, fd);
}

static void submit_send(int fd, size_t len) {
  struct io_uring_sqe* s = get_sqe();
  s->opcode = IORING_OP_SEND;
  s->fd = fd;
  s->addr = (uint64_t)(uintptr_t)conns[fd].out;
  s->len = (unsigned)len;
  s->msg_flags = MSG_NOSIGNAL;
  s->user_data = tag(kSend, fd);
}

static void submit_accept(int lfd) {
  struct io_uring_sqe* s = get_sqe();
  s->opcode = IORING_OP_ACCEPT;
  s->fd = lfd;
  s->ioprio = IORING_ACCEPT_MULTISHOT;
  s->user_data = tag(kAccept, lfd);
}

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: floor_uring PORT\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  conns = calloc(kMaxFd, sizeof *conns);
  int one = 1;
  int lfd = floor_listen(argv[1], 0);
  struct io_uring_params p = {0};
  p.flags = IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN | IORING_SETUP_CQSIZE;
  p.cq_entries = 4 * kEntries;
  ring_fd = (int)syscall(__NR_io_uring_setup, kEntries, &p);
  if (ring_fd < 0) {
    perror("floor_uring: io_uring_setup");
    return 1;
  }
  size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
  size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
  if (cq_len > sq_len) sq_len = cq_len;  // IORING_FEAT_SINGLE_MMAP: one mapping for both rings
  char* rings = mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, ring_fd,
                     IORING_OFF_SQ_RING);
  sqes = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
              MAP_SHARED | MAP_POPULATE, ring_fd, IORING_OFF_SQES);
  if (rings == MAP_FAILED || sqes == MAP_FAILED || !(p.features & IORING_FEAT_SINGLE_MMAP)) {
    fprintf(stderr, "floor_uring: mmap failed or no IORING_FEAT_SINGLE_MMAP\n");
    return 1;
  }
  sq_head = (unsigned*)(rings + p.sq_off.head);
  sq_tail = (unsigned*)(rings + p.sq_off.tail);
  sq_mask = (unsigned*)(rings + p.sq_off.ring_mask);
  sq_array = (unsigned*)(rings + p.sq_off.array);
  cq_head = (unsigned*)(rings + p.cq_off.head);
  cq_tail = (unsigned*)(rings + p.cq_off.tail);
  cq_mask = (unsigned*)(rings + p.cq_off.ring_mask);
  cqes = (struct io_uring_cqe*)(rings + p.cq_off.cqes);

  submit_accept(lfd);
  for (;;) {
    int r = (int)syscall(__NR_io_uring_enter, ring_fd, to_submit, 1, IORING_ENTER_GETEVENTS, NULL,
                         0);
    if (r < 0 && errno != EINTR && errno != EAGAIN && errno != EBUSY) {
      perror("floor_uring: io_uring_enter");
      return 1;
    }
    if (r >= 0) to_submit -= (unsigned)r > to_submit ? to_submit : (unsigned)r;
    unsigned head = *cq_head;
    unsigned tail = __atomic_load_n(cq_tail, __ATOMIC_ACQUIRE);
    for (; head != tail; ++head) {
      struct io_uring_cqe* c = &cqes[head & *cq_mask];
      int kind = (int)(c->user_data >> 32);
      int fd = (int)(uint32_t)c->user_data;
      int res = c->res;
      if (kind == kAccept) {
        if (res >= 0 && res < kMaxFd) {
          setsockopt(res, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
          conns[res].close_after = 0;
          submit_recv(res);
        } else if (res >= 0) {
          close(res);
        }
        if (!(c->flags & IORING_CQE_F_MORE)) submit_accept(lfd);  // multishot ended: re-arm
      } else if (kind == kRecv) {
        if (res <= 0) {
          close(fd);
          continue;
        }
        struct conn* k = &conns[fd];
        k->in[res] = '\0';
        size_t len = floor_answers(k->in, k->out, kMaxBatch, &k->close_after);
        if (len == 0) {
          submit_recv(fd);
          continue;
        }
        submit_send(fd, len);
      } else if (kind == kSend) {
        if (res < 0 || conns[fd].close_after) {
          close(fd);
          continue;
        }
        submit_recv(fd);
      }
    }
    __atomic_store_n(cq_head, head, __ATOMIC_RELEASE);
  }
}
