// Fuzzes the etcd gateway codec (cluster/etcd_codec.h): what an etcd member, or whatever answers
// on its port, sends back. The input goes whole to every response decoder and, cut by the
// LineSplitter at splits seeded by byte 0, line by line to the stream decoders (watch,
// keep-alive). Nothing may throw or crash; checked: a key or value decoded from base64 encodes
// back to base64 that decodes to the same bytes; a request built from the input's bytes encodes to
// JSON whose key decodes back to them; the splitter gives the same lines however the bytes arrive.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/etcd_codec.h"

namespace {

using namespace corral::cluster;

void check(bool ok) {
  if (!ok) __builtin_trap();
}

void check_kv(const KeyValue& kv) {
  check(*base64_decode(base64_encode(kv.key)) == kv.key);
  check(*base64_decode(base64_encode(kv.value)) == kv.value);
}

std::vector<std::string> lines_of(std::string_view data, size_t step) {
  std::vector<std::string> out;
  LineSplitter s(4096);
  for (size_t i = 0; i < data.size(); i += step) {
    if (!s.feed(data.substr(i, step))) break;
    while (auto line = s.next_line()) out.emplace_back(*line);
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);

  if (auto r = decode_range(in)) {
    for (const auto& kv : r->kvs) check_kv(kv);
  }
  (void)decode_put(in);
  (void)decode_delete_range(in);
  if (auto t = decode_txn(in)) {
    for (const auto& op : t->responses)
      if (const auto* rr = std::get_if<RangeResponse>(&op))
        for (const auto& kv : rr->kvs) check_kv(kv);
  }
  (void)decode_lease_grant(in);
  (void)decode_lease_revoke(in);
  (void)decode_error(400, in);

  auto whole = lines_of(in, in.size() + 1);
  auto pieces = lines_of(in, 1 + data[0] % 7);
  // The small splitter breaks at the same line whatever the pieces, so the lines before it agree.
  size_t common = std::min(whole.size(), pieces.size());
  for (size_t i = 0; i < common; ++i) check(whole[i] == pieces[i]);
  for (const auto& line : whole) {
    if (auto w = decode_watch(line)) {
      for (const auto& ev : w->events) check_kv(ev.kv);
    }
    (void)decode_lease_keepalive(line);
  }

  // Requests from arbitrary bytes: the JSON names the same key.
  RangeRequest req{.key = std::string(in.substr(0, in.size() / 2)), .range_end = prefix_end(in)};
  std::string body = encode(req);
  check(body.find(base64_encode(req.key)) != std::string::npos);
  if (auto raw = base64_decode(in)) check(*base64_decode(base64_encode(*raw)) == *raw);
  return 0;
}
