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
// example, an installed corral without it).
std::optional<WorkerKind> demo_worker_kind();

// Adds the demo kind to `config` when it declares no worker kinds and serves no directory, and the
// demo program is there. Returns whether it did. `corral serve` calls it only without --config
// (a config file, even one without kinds, keeps its single-process, no-worker behaviour).
bool add_demo_kind(Config& config);

// The welcome page's list item for the demo (plain HTML, not a format string).
std::string_view demo_welcome_item();

}  // namespace corral::cli
