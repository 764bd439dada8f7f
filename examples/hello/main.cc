// An embedding application: its own routes, a wrap and an authenticator, served by corral's
// HTTP core in one process. Build: part of the project (target `example_hello`), or on its own
// against an installed corral (CMakeLists.txt).
#include <cstdlib>
#include <iostream>

#include <nlohmann/json.hpp>

#include "http/runner.h"

int main(int argc, char** argv) {
  using namespace corral;
  const char* listen = argc > 1 ? argv[1] : "127.0.0.1:8081";
  http::SiteBuilder site;
  site.authenticate([](const http::Request& req) -> std::optional<http::Principal> {
    if (req.header("authorization") == "Bearer demo") return http::Principal{"demo", {}};
    return std::nullopt;
  });
  site.wrap("/*", {.before = nullptr, .after = [](http::Request&, http::Response& r) {
                     r.header("X-Example", "hello");
                   }});
  site.route("GET /", [](http::Request& req) {
    return http::Response::text(req.principal ? "hello, " + req.principal->id + "\n" : "hello\n");
  });
  site.route("GET /greet/{name}", [](http::Request& req) {
    return http::Response::json({{"greeting", "hello " + std::string(req.param("name"))}});
  });
  auto built = site.build();
  if (!built) {
    std::cerr << built.error().reason << "\n";
    return 78;
  }
  auto addr = core::parse_address(listen);
  if (!addr) {
    std::cerr << addr.error().reason << "\n";
    return 78;
  }
  core::Logger log;
  http::RunOptions options;
  options.listen.push_back(addr.value());
  return http::run_server(log, options, std::move(built.value()));
}
