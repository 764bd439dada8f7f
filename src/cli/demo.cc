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

std::optional<WorkerKind> demo_worker_kind() {
  std::string path = demo_worker_path();
  if (path.empty()) return std::nullopt;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || ::access(path.c_str(), X_OK) != 0)
    return std::nullopt;
  WorkerKind kind;
  kind.name = "note";
  kind.command = {path};
  kind.routes = {"/note/{id}/*"};
  kind.idle_ms = 60'000;
  return kind;
}

bool add_demo_kind(Config& config) {
  if (!config.workers.empty() || !config.root.empty()) return false;
  auto kind = demo_worker_kind();
  if (!kind) return false;
  config.workers.push_back(std::move(*kind));
  return true;
}

std::string_view demo_welcome_item() {
  return "<li><a href=\"/note/welcome/\">/note/{id}/</a>: a note per address, a worker process "
         "each, its state in a SQLite file per address (examples/notes)</li>\n";
}

}  // namespace corral::cli
