// Fuzzes admission: the input is split at '\n' into a request target, a Host value, a Forwarded
// value, an X-Forwarded-For value, an X-Forwarded-Proto value and a method name (a missing line
// leaves that part out). Each part is copied into its own heap buffer so that AddressSanitizer
// catches any read past a view. admit() runs twice, from a relay peer and from a non-relay peer,
// and a few invariants of an admitted request are checked.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "http/admission.h"

namespace {

using corral::http::AdmissionPolicy;
using corral::http::Peer;

const AdmissionPolicy& policy() {
  static const AdmissionPolicy p = [] {
    AdmissionPolicy out;
    out.allowed_hosts = {"example.com"};
    out.relays = {corral::http::parse_relay("127.0.0.0/8").value()};
    return out;
  }();
  return p;
}

const Peer& peer(bool relay) {
  static const Peer kRelay = Peer::from(corral::core::parse_address("127.0.0.1:40000").value());
  static const Peer kOther = Peer::from(corral::core::parse_address("[::1]:40000").value());
  return relay ? kRelay : kOther;
}

void check(bool ok) {
  if (!ok) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> parts;
  while (parts.size() < 6) {
    size_t nl = in.find('\n');
    parts.emplace_back(in.substr(0, nl));
    if (nl == std::string_view::npos) break;
    in.remove_prefix(nl + 1);
  }
  static constexpr std::string_view kNames[] = {"Host", "Forwarded", "X-Forwarded-For",
                                                "X-Forwarded-Proto"};
  for (bool relay : {true, false}) {
    corral::http::Request req;
    req.target = parts[0];
    for (size_t i = 1; i < parts.size() && i <= 4; ++i) req.headers.add(kNames[i - 1], parts[i]);
    if (parts.size() > 5) req.method = corral::http::parse_method(parts[5]);
    req.version_minor = size % 2;  // both HTTP/1.0 and HTTP/1.1
    corral::http::Admission a = corral::http::admit(req, peer(relay), policy());
    check(a.status == 0 || a.status == 400 || a.status == 403 || a.status == 501);
    check(a.status == 0 || !a.reason.empty());
    if (a.status == 0) {
      check(req.target == "*" || (!req.target.empty() && req.target[0] == '/'));
      check(req.path.find("/../") == std::string_view::npos);  // dots in a query are fine
      check(req.host.empty() || corral::http::valid_host(req.host));
      check(req.host.empty() || corral::http::still_admitted(req.host, policy()));
      check(!req.remote_address.empty());
      check(req.scheme == "http" || req.scheme == "https");
      check(relay || req.headers.size() <= 1);  // forwarding headers only from the relay
    }
  }
  return 0;
}
