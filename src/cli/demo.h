// The demo `corral serve` runs with no arguments: the notes worker (examples/notes, built as
// `corral-notes-worker` next to the `corral` binary) as the kind "note" on "/note/{id}/*": a note
// per address, a worker process each, its state in a SQLite file per address.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "cli/config.h"

namespace corral::cli {

inline constexpr std::string_view kDemoWorkerProgram = "corral-notes-worker";

// <directory of the running binary (/proc/self/exe)>/corral-notes-worker; "" when the running
// binary's path cannot be read.
std::string demo_worker_path();

// The kind {name "note", command {demo_worker_path()}, routes {"/note/{id}/*"}, idle 60 s} when
// that program exists and is executable (a regular file); nullopt otherwise (a build without the
// example, an installed corral without it), with the reason in `*why` when given.
std::optional<WorkerKind> demo_worker_kind(std::string* why = nullptr);

// What add_demo_kind did.
struct DemoResult {
  bool added = false;
  // Non-empty when the demo applies but cannot run: why, and what to do (plain text). Logged at
  // startup and said on the welcome page, instead of a link that would answer 404.
  std::string unavailable;
};

// Adds the demo kind to `config` when it declares no worker kinds and serves no directory, and the
// demo program is there. `corral serve` calls it only without --config (a config file, even one
// without kinds, keeps its single-process, no-worker behaviour).
DemoResult add_demo_kind(Config& config);

// The welcome page's list item for the demo (plain HTML, not a format string): its link when it
// was added, why it is unavailable when it could not be, nothing when it does not apply.
std::string demo_welcome_item(const DemoResult& demo);

}  // namespace corral::cli
