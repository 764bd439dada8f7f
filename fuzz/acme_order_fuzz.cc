// Fuzzes the ACME client's side of the conversation: the input is a sequence of raw HTTP responses
// (separated by "\n--\n") that answer the requests an acme::Order asks for, in turn. Each goes
// through the sans-IO response parser (acme/http_client.h) and then into the order, until it
// stops or the input runs out. The account key is made once; nothing touches the network.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "acme/http_client.h"
#include "acme/order.h"

namespace {
const corral::acme::AccountKey& key() {
  static auto k = corral::acme::AccountKey::generate();
  return k.value();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  corral::acme::OrderOptions options;
  options.directory_url = "https://ca.test/dir";
  options.email = "ops@example.org";
  options.domains = {"example.org", "www.example.org"};
  options.max_polls = 5;
  corral::acme::Order order(options, key(), "CSR");
  for (int steps = 0; steps < 200; ++steps) {
    corral::acme::Step step = order.next();
    if (step.kind == corral::acme::Step::kDone || step.kind == corral::acme::Step::kFailed) break;
    if (step.kind != corral::acme::Step::kSend) continue;
    if (input.empty()) break;
    size_t sep = input.find("\n--\n");
    std::string_view raw = input.substr(0, sep);
    input = sep == std::string_view::npos ? std::string_view() : input.substr(sep + 4);
    auto response = corral::acme::parse_response(raw, step.request.method == "HEAD");
    if (response)
      order.on_response(response.value());
    else
      order.on_transport_error(response.error().reason);
  }
  return 0;
}
