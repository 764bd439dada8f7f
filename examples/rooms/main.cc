// An embedding application that hosts a worker kind (app/app.h): chat rooms, one worker process
// per room, run by the same supervisor `corral serve` runs.
//
//   * its site authenticates with a bearer token ("Authorization: Bearer <token>", a fixed table
//     here) mapped to a principal;
//   * the kind `room` serves /room/{name}/*: a request for /room/kitchen/ goes to the worker of
//     "room:kitchen". Its authorize hook admits only the room's members (an anonymous request, or
//     a stranger, is refused with 403 before any worker forks); its start hook gives the worker
//     the room's members; its worker is a function of this program (in_process), run in the
//     forked child by worker::worker_main — no second binary;
//   * the principal "boom" makes the authorize hook throw (refused, logged `authorize_failed`):
//     the e2e test's way to check that a broken hook refuses.
//
// Usage: example_rooms [--listen ADDR] [--state-dir DIR] (default 127.0.0.1:8082 and the state
// directory's defaults, app::state_directory). SIGTERM stops
// the server processes and the workers. Built by examples/CMakeLists.txt; tests/e2e/
// test_embedding.py runs it.
#include <cstdlib>
#include <iostream>
#include <map>
#include <set>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "app/app.h"
#include "worker/worker.h"

namespace {

using namespace corral;

const std::map<std::string, std::string> kTokens = {
    {"alice-token", "alice"}, {"bob-token", "bob"}, {"boom-token", "boom"}};
const std::map<std::string, std::set<std::string>> kMembers = {{"kitchen", {"alice", "bob"}},
                                                               {"attic", {"alice"}}};

// "room:kitchen" -> "kitchen"
std::string room_of(std::string_view address) {
  auto colon = address.find(':');
  return std::string(colon == std::string_view::npos ? address : address.substr(colon + 1));
}

// The worker of one room, in the forked child: it answers who is asking (the proxy's
// Corral-Principal header) and the members the start hook gave it.
int room_worker() {
  return worker::worker_main([](worker::WorkerContext& ctx, http::SiteBuilder& site) {
    std::string room = room_of(ctx.address());
    nlohmann::json members = ctx.start_data().value("members", nlohmann::json::array());
    site.route("GET /", [room, members](http::Request& req) {
      auto who = req.header("corral-principal");
      return http::Response::json(
          {{"room", room}, {"principal", who ? std::string(*who) : ""}, {"members", members}});
    });
  });
}

workers::KindConfig room_kind() {
  workers::KindConfig kind;
  kind.name = "room";
  kind.routes = {"/room/{name}/*"};
  kind.in_process = room_worker;
  kind.idle_ms = 60'000;
  kind.authorize = [](const std::optional<std::string>& principal, std::string_view address) {
    if (!principal) return false;
    if (*principal == "boom") throw std::runtime_error("the member list is unreachable");
    auto room = kMembers.find(room_of(address));
    return room != kMembers.end() && room->second.count(*principal) > 0;
  };
  kind.start_hook = [](std::string_view address) {
    auto room = kMembers.find(room_of(address));
    nlohmann::json members = nlohmann::json::array();
    if (room != kMembers.end())
      for (const auto& m : room->second) members.push_back(m);
    return nlohmann::json{{"members", members}};
  };
  return kind;
}

}  // namespace

int main(int argc, char** argv) {
  std::string listen_arg = "127.0.0.1:8082", state_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--listen") {
      listen_arg = argv[i + 1];
    } else if (flag == "--state-dir") {
      state_dir = argv[i + 1];
    } else {
      std::cerr << "usage: example_rooms [--listen ADDR] [--state-dir DIR]\n";
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::cerr << "usage: example_rooms [--listen ADDR] [--state-dir DIR]\n";
    return 2;
  }
  auto listen = core::parse_address(listen_arg);
  if (!listen) {
    std::cerr << "example_rooms: " << listen.error().reason << "\n";
    return 2;
  }
  app::Options options;
  options.listen = listen.value();
  options.state_dir = state_dir;
  options.kinds.push_back(room_kind());
  core::Logger log(2);  // stderr; the site's routes log to it (authorize_failed), so it is first
  auto built = app::build_site(options, log, [](http::SiteBuilder& site) {
    site.authenticate([](const http::Request& req) -> std::optional<http::Principal> {
      auto auth = req.header("authorization");
      if (!auth || !auth->starts_with("Bearer ")) return std::nullopt;
      auto it = kTokens.find(std::string(auth->substr(7)));
      if (it == kTokens.end()) return std::nullopt;
      return http::Principal{it->second, {}};
    });
    site.route("GET /", [](http::Request& req) {
      return http::Response::text(req.principal ? "rooms, for " + req.principal->id + "\n"
                                                : "rooms\n");
    });
  });
  if (!built) {
    std::cerr << "example_rooms: routes: " << built.error().reason << "\n";
    return app::kExitBadConfig;
  }
  return app::serve(log, std::move(options));
}
