// The SK_REUSEPORT steering program: picks, for every UDP datagram that reaches a QUIC listening
// address, the socket of the server process that owns it. It is the C twin of packet_owner() in
// quic/steering.cc and must decide exactly as it does (bpf_steering_test.cc checks both against
// steering_vectors.h). Loaded once per reuseport group by the supervisor (quic/bpf_steering.cc);
// built by clang at build time and embedded in the corral binary.
//
// Maps: `socks` (REUSEPORT_SOCKARRAY, slot -> socket) and `cfg` (one steer_cfg: tag, seed, slots).
// Every path returns SK_PASS: when no socket was selected (no owner, an empty slot, a slot past
// `slots`), the kernel falls back to its 4-tuple hash, which is what userspace expects too.
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>

#define SLOTS_MAX 64
#define UDP_HEADER 8
#define CID_LENGTH 18
#define WANT 26 /* flags(1) version(4) dcid length(1) dcid(<= 20) */

struct steer_cfg {
  __u32 tag;
  __u32 seed;
  __u32 slots;
};

struct {
  __uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
  __uint(max_entries, SLOTS_MAX);
  __type(key, __u32);
  __type(value, __u64);
} socks SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct steer_cfg);
} cfg SEC(".maps");

#define FNV(h, b) (h) = ((h) ^ (__u32)(b)) * 16777619u

// initial_hash() in steering.cc, unrolled: no loops for old verifiers.
static __always_inline __u32 initial_hash(const __u8 *d, __u32 seed) {
  __u32 h = 2166136261u;
  FNV(h, (seed >> 24) & 0xff);
  FNV(h, (seed >> 16) & 0xff);
  FNV(h, (seed >> 8) & 0xff);
  FNV(h, seed & 0xff);
  FNV(h, d[0]);
  FNV(h, d[1]);
  FNV(h, d[2]);
  FNV(h, d[3]);
  FNV(h, d[4]);
  FNV(h, d[5]);
  FNV(h, d[6]);
  FNV(h, d[7]);
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

static __always_inline __u32 tag_of(const __u8 *cid) {
  return ((__u32)cid[2] << 24) | ((__u32)cid[3] << 16) | ((__u32)cid[4] << 8) | (__u32)cid[5];
}

SEC("sk_reuseport")
int steer(struct sk_reuseport_md *md) {
  __u32 zero = 0;
  struct steer_cfg *c = bpf_map_lookup_elem(&cfg, &zero);
  if (!c) return SK_PASS;
  __u32 slots = c->slots, tag = c->tag, seed = c->seed;
  if (slots == 0 || slots > SLOTS_MAX) return SK_PASS;

  // md->len counts from the UDP header. Load what there is, up to WANT bytes: a short datagram
  // must be judged on its real length, as packet_owner() does.
  __u64 len = md->len;
  if (len <= UDP_HEADER) return SK_PASS;
  len -= UDP_HEADER;
  if (len > WANT) len = WANT;
  __u8 b[WANT] = {};
  if (bpf_skb_load_bytes(md, UDP_HEADER, b, len) < 0) return SK_PASS;

  __u32 key;
  if (b[0] & 0x80) {
    // Long header: flags(1) version(4) dcid_len(1) dcid.
    if (len < 6) return SK_PASS;
    __u64 dlen = b[5];
    if (dlen > 20 || len < 6 + dlen) return SK_PASS;
    if (dlen == CID_LENGTH && tag_of(b + 6) == tag) {
      key = b[7];
      if (key >= slots) return SK_PASS;
    } else {
      if (dlen < 8) return SK_PASS;
      key = initial_hash(b + 6, seed) % slots;
    }
  } else {
    // Short header: flags(1) dcid(CID_LENGTH).
    if (len < 1 + CID_LENGTH) return SK_PASS;
    if (tag_of(b + 1) != tag) return SK_PASS;
    key = b[2];
    if (key >= slots) return SK_PASS;
  }
  // An empty slot (-ENOENT) or any other failure leaves the choice to the kernel's hash.
  bpf_sk_select_reuseport(md, &socks, &key, 0);
  return SK_PASS;
}

char LICENSE[] SEC("license") = "GPL";
