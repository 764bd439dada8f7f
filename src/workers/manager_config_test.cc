// The Manager's configuration: route patterns are checked in the HTTP router's own syntax (the
// error names the kind and the pattern), and address_for matches with the same router.
#include <stdlib.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "core/event_loop.h"
#include "core/log.h"
#include "workers/manager.h"

namespace corral::workers {
namespace {

class ManagerConfig : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/corral-workers-config-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    state_ = tmpl;
  }
  void TearDown() override { std::filesystem::remove_all(state_); }

  static KindConfig kind(std::string name, std::vector<std::string> routes) {
    KindConfig k;
    k.name = std::move(name);
    k.command = {"/bin/true"};
    k.routes = std::move(routes);
    return k;
  }
  core::Result<std::unique_ptr<Manager>> create(std::vector<KindConfig> kinds) {
    ManagerOptions o;
    o.state_dir = state_;
    o.kinds = std::move(kinds);
    return Manager::create(loop_, log_, std::move(o), nullptr);
  }
  std::string refusal(std::vector<KindConfig> kinds) {
    auto m = create(std::move(kinds));
    EXPECT_FALSE(m.ok());
    return m.ok() ? std::string() : m.error().reason;
  }

  core::EventLoop loop_;
  core::Logger log_{2, core::LogLevel::kError};
  std::string state_;
};

TEST_F(ManagerConfig, RoutePatternsAreTheRoutersAndNameTheirKind) {
  EXPECT_NE(refusal({kind("doc", {"/doc/*/x"})}).find("workers.doc.routes: \"/doc/*/x\""),
            std::string::npos);
  // What the router refuses and the manager's own parser took: an empty segment, a {param}
  // that is not an identifier.
  EXPECT_NE(refusal({kind("doc", {"/doc//{id}"})}).find("workers.doc.routes"), std::string::npos);
  EXPECT_NE(refusal({kind("doc", {"/doc/{a b}"})}).find("workers.doc.routes"), std::string::npos);
  EXPECT_NE(refusal({kind("doc", {"GET /doc/{id}"})}).find("must start with '/'"),
            std::string::npos);
  EXPECT_NE(refusal({kind("doc", {"/doc/%7Bid%7D"})}).find("has no {param}"), std::string::npos);
  // Two kinds on one shape would conflict in the site too.
  EXPECT_NE(refusal({kind("a", {"/x/{id}/*"}), kind("b", {"/x/{key}/*"})}).find("workers: routes"),
            std::string::npos);
  EXPECT_TRUE(create({kind("a", {"/x/{id}/*"}), kind("b", {"/x/{id}/y"})}).ok());
}

TEST_F(ManagerConfig, AddressForUsesTheRoutersPrecedence) {
  auto m = create({kind("a", {"/x/{id}/*"}), kind("b", {"/x/{id}/y", "/p/{k}/{v}"})});
  ASSERT_TRUE(m.ok()) << m.error().reason;
  EXPECT_EQ(m.value()->address_for("/x/1/y"), "b:1");  // a literal before the wildcard
  EXPECT_EQ(m.value()->address_for("/x/1/z"), "a:1");
  EXPECT_EQ(m.value()->address_for("/p/%41/b%20c?q"), "b:A:b c");
  EXPECT_EQ(m.value()->address_for("/p/a"), std::nullopt);
  // Long keys are addresses too (their lock and socket names are bounded, not the key).
  EXPECT_EQ(m.value()->address_for("/x/" + std::string(300, 'k')), "a:" + std::string(300, 'k'));
  // One {param} may hold ':'; with several, a ':' would make two paths one address.
  EXPECT_EQ(m.value()->address_for("/x/1:2/z"), "a:1:2");
  EXPECT_EQ(m.value()->address_for("/p/x:y/z"), std::nullopt);
  EXPECT_EQ(m.value()->address_for("/p/x/y%3Az"), std::nullopt);
  EXPECT_EQ(m.value()->address_for("/p/x/y"), "b:x:y");
}

}  // namespace
}  // namespace corral::workers
