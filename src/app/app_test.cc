// The parts of app/app.h that decide before anything runs: which mode serve() picks, where the
// state directory is (and that an unsafe one is refused), and that build_site puts the kinds'
// proxy routes and the application's routes in one site (a conflict between them is an error).
// serve() itself runs end to end in tests/e2e (test_embedding.py and every `corral serve` test).
#include "app/app.h"

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <gtest/gtest.h>

#include "core/owned_path.h"

namespace corral::app {
namespace {

Options with_kind() {
  Options o;
  workers::KindConfig k;
  k.name = "room";
  k.routes = {"/room/{name}/*"};
  k.in_process = [] { return 0; };
  o.kinds.push_back(k);
  return o;
}

TEST(App, SupervisedWithProcessesKindsOrTls) {
  Options o;
  EXPECT_FALSE(supervised(o));
  o.processes = 0;  // one per CPU
  EXPECT_TRUE(supervised(o));
  EXPECT_TRUE(supervised(with_kind()));
}

TEST(App, StateDirectoryDefaultsToXdgAndRefusesAnUnsafeOne) {
  char tmpl[] = "/tmp/corral-app-XXXXXX";
  std::string tmp = mkdtemp(tmpl);
  setenv("XDG_STATE_HOME", tmp.c_str(), 1);
  auto dir = state_directory("");
  ASSERT_TRUE(dir.ok()) << dir.error().reason;
  EXPECT_EQ(dir.value(), tmp + "/corral");
  std::string open_dir = tmp + "/open";
  ASSERT_EQ(mkdir(open_dir.c_str(), 0700), 0);
  ASSERT_EQ(chmod(open_dir.c_str(), 0777), 0);
  auto unsafe = state_directory(open_dir);
  ASSERT_FALSE(unsafe.ok());
  EXPECT_EQ(unsafe.error().code, core::kErrorUnsafePath);
  unsetenv("XDG_STATE_HOME");
  std::filesystem::remove_all(tmp);
}

TEST(App, BuildSiteHasTheKindsRoutesAndTheApplications) {
  core::Logger log(2);
  Options o = with_kind();
  auto r = build_site(o, log, [](http::SiteBuilder& site) {
    site.route("GET /", [](http::Request&) { return http::Response::text("home\n"); });
  });
  ASSERT_TRUE(r.ok()) << r.error().reason;
  EXPECT_TRUE(o.site);
  EXPECT_TRUE(o.resolver_slot);
}

TEST(App, BuildSiteReportsAConflictWithAKindsRoute) {
  core::Logger log(2);
  Options o = with_kind();
  auto r = build_site(o, log, [](http::SiteBuilder& site) {
    site.route("/room/{name}/*", [](http::Request&) { return http::Response::text("mine\n"); });
  });
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(o.site);
}

}  // namespace
}  // namespace corral::app
