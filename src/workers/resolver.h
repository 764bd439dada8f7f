// LinkResolver: the server process's end of its link to the supervisor. A proxied request asks
// it for its address's worker socket; it answers from a small cache or sends a `resolve` message
// and answers when the supervisor does (`resolved` or `refused`). A socket comes with its
// worker's pid and whether the request waited for the worker's start (proxy::UpstreamProcess,
// for the access log). The supervisor's end is
// workers/link_server.h; both speak workers/link_codec.h, whose header specifies the messages.
//
// Lifetime: one per server process, owned by its ProcessServices, on the process's loop; answers
// still pending when the link closes get a 503. Single-threaded.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/event_loop.h"
#include "core/message_link.h"
#include "http/response.h"
#include "proxy/proxy.h"

namespace corral::workers {

// A refusal as the client sees it: the status and {"error":{message, code?, reason?}}, with
// Retry-After when `retry_after_s` > 0 (a bound was reached: the same request may work later).
http::Response error_response(int status, const nlohmann::json& error, uint32_t retry_after_s = 0);

class LinkResolver {
 public:
  using Answer = proxy::UpstreamAnswer;  // called once, with the socket's path or a refusal
  // A resolved address is remembered this long: requests to a running worker skip the round trip
  // to the supervisor. The supervisor sends "forget" when the worker stops, fails or is
  // suspended, and a connection that fails asks again (fresh), so a stale entry costs at most
  // one failed connect.
  static constexpr uint64_t kCacheMs = 1000;
  static constexpr size_t kCacheMax = 4096;

  LinkResolver(core::EventLoop& loop, core::UniqueFd fd);
  // Pending answers are dropped, not called: the link's own destructor would otherwise answer
  // them from members already destroyed (the process, and its requests, are going away).
  ~LinkResolver() { link_.on_closed = nullptr; }
  LinkResolver(const LinkResolver&) = delete;
  LinkResolver& operator=(const LinkResolver&) = delete;
  void resolve(const std::string& address, Answer answer, bool fresh = false);
  // A report of this process's state to the supervisor (see ProcessServices).
  void report(std::string message) { link_.send(std::move(message)); }
  // Resolve messages sent to the supervisor so far (the rest were answered from the cache).
  uint64_t sent() const { return sent_; }
  size_t cached() const { return cache_.size(); }

 private:
  void on_message(std::string_view message);
  struct Cached {
    std::string path;
    uint64_t until_ms;
    int64_t pid;  // the worker's: a request answered from here found it running (warm)
  };
  core::EventLoop& loop_;
  std::map<std::string, Cached> cache_;
  core::MessageLink link_;
  uint64_t next_id_ = 1;
  uint64_t sent_ = 0;
  std::map<uint64_t, std::pair<std::string, Answer>> pending_;  // id -> address, answer
};

}  // namespace corral::workers
