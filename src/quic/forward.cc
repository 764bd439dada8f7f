#include "quic/forward.h"

#include <sys/socket.h>

#include <cstring>

namespace corral::quic {

namespace {

constexpr uint8_t kMagic[4] = {'C', 'Q', 'F', '1'};
// magic + ecn + two address lengths
constexpr size_t kFixed = sizeof(kMagic) + 3;
// Only datagrams up to this size are forwarded (QUIC's largest UDP payload we accept, 65527, plus
// the header); a stack buffer of this size is what forward_datagram uses.
constexpr size_t kMaxMessage = 65535 + kFixed + 2 * sizeof(sockaddr_storage);

bool valid_address(const uint8_t* p, size_t len) {
  if (len < sizeof(sa_family_t)) return false;
  sa_family_t family;
  std::memcpy(&family, p, sizeof family);
  if (family == AF_INET) return len == sizeof(sockaddr_in);
  if (family == AF_INET6) return len == sizeof(sockaddr_in6);
  return false;
}

}  // namespace

size_t encode_forwarded(const ForwardHeader& h, const uint8_t* data, size_t len, uint8_t* out,
                        size_t cap) {
  size_t llen = h.local.len, rlen = h.remote.len;
  if (llen > sizeof(sockaddr_storage) || rlen > sizeof(sockaddr_storage) || llen > 255 ||
      rlen > 255)
    return 0;
  size_t total = kFixed + llen + rlen + len;
  if (total > cap) return 0;
  uint8_t* p = out;
  std::memcpy(p, kMagic, sizeof kMagic);
  p += sizeof kMagic;
  *p++ = h.ecn;
  *p++ = static_cast<uint8_t>(llen);
  std::memcpy(p, &h.local.storage, llen);
  p += llen;
  *p++ = static_cast<uint8_t>(rlen);
  std::memcpy(p, &h.remote.storage, rlen);
  p += rlen;
  if (len) std::memcpy(p, data, len);
  return total;
}

bool decode_forwarded(const uint8_t* msg, size_t msg_len, ForwardHeader& h, const uint8_t** data,
                      size_t* len) {
  if (msg_len < kFixed || std::memcmp(msg, kMagic, sizeof kMagic) != 0) return false;
  const uint8_t* p = msg + sizeof kMagic;
  const uint8_t* end = msg + msg_len;
  uint8_t ecn = *p++;
  if (ecn > 3) return false;  // two bits of the IP header
  size_t llen = *p++;
  if (static_cast<size_t>(end - p) < llen + 1 || !valid_address(p, llen)) return false;
  ForwardHeader out;
  out.ecn = ecn;
  std::memcpy(&out.local.storage, p, llen);
  out.local.len = static_cast<socklen_t>(llen);
  p += llen;
  size_t rlen = *p++;
  if (static_cast<size_t>(end - p) < rlen || !valid_address(p, rlen)) return false;
  std::memcpy(&out.remote.storage, p, rlen);
  out.remote.len = static_cast<socklen_t>(rlen);
  p += rlen;
  h = out;
  *data = p;
  *len = static_cast<size_t>(end - p);
  return true;
}

bool forward_datagram(int tx_fd, const ForwardHeader& h, const uint8_t* data, size_t len) {
  // The header goes in its own iovec so the payload is not copied.
  uint8_t head[kFixed + 2 * sizeof(sockaddr_storage)];
  size_t n = encode_forwarded(h, nullptr, 0, head, sizeof head);
  if (n == 0 || n + len > kMaxMessage) return false;
  iovec iov[2] = {{head, n}, {const_cast<uint8_t*>(data), len}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = len ? 2 : 1;
  ssize_t w;
  do {
    w = ::sendmsg(tx_fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
  } while (w < 0 && errno == EINTR);
  return w == static_cast<ssize_t>(n + len);
}

}  // namespace corral::quic
