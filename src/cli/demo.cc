#include "cli/demo.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>

namespace corral::cli {

std::string demo_worker_path() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf);
  if (n <= 0 || static_cast<size_t>(n) >= sizeof buf) return {};
  std::string exe(buf, static_cast<size_t>(n));
  size_t slash = exe.rfind('/');
  if (slash == std::string::npos) return {};
  return exe.substr(0, slash + 1) + std::string(kDemoWorkerProgram);
}

std::optional<WorkerKind> demo_worker_kind(std::string* why) {
  std::string path = demo_worker_path();
  auto no = [why](std::string reason) {
    if (why) *why = std::move(reason);
    return std::nullopt;
  };
  if (path.empty()) return no("the running binary's path (/proc/self/exe) cannot be read");
  struct stat st;
  if (::stat(path.c_str(), &st) != 0)
    return no(path + " is missing: build it (cmake --build --preset release --target " +
              std::string(kDemoWorkerProgram) + "; scripts/run does)");
  if (!S_ISREG(st.st_mode) || ::access(path.c_str(), X_OK) != 0)
    return no(path + " is not an executable file");
  WorkerKind kind;
  kind.name = "note";
  kind.command = {path};
  kind.routes = {"/note/{id}/*"};
  kind.idle_ms = 60'000;
  return kind;
}

DemoResult add_demo_kind(Config& config) {
  DemoResult r;
  if (!config.workers.empty() || !config.root.empty()) return r;
  auto kind = demo_worker_kind(&r.unavailable);
  if (!kind) return r;
  config.workers.push_back(std::move(*kind));
  r.added = true;
  return r;
}

std::string demo_welcome_item(const DemoResult& demo) {
  if (demo.added)
    return "<li><a href=\"/note/welcome/\">/note/{id}/</a>: a note per address, a worker process "
           "each, its state in a SQLite file per address (examples/notes)</li>\n";
  if (demo.unavailable.empty()) return {};
  std::string item = "<li>/note/{id}/: the notes demo is unavailable: ";
  for (char c : demo.unavailable) {  // a path: escaped for HTML
    const char* entity = c == '<' ? "&lt;" : c == '>' ? "&gt;" : c == '&' ? "&amp;" : nullptr;
    if (entity)
      item += entity;
    else
      item += c;
  }
  return item + "</li>\n";
}

}  // namespace corral::cli
