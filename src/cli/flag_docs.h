// The command line's flags as Markdown tables, read from the CLI11 definition itself, so that the
// flag reference in docs/config.md (written by scripts/gen-flag-docs, checked by the docs.flags
// test) cannot drift from what `corral` accepts. Pure: an App in, text out.
#pragma once

#include <CLI/CLI.hpp>
#include <string>

namespace corral::cli {

// One table per subcommand (in the order they were added): flag, value, description. Hidden
// options (an empty group) and --help are left out; '|' in a description is escaped.
std::string flag_tables_markdown(const CLI::App& app);

}  // namespace corral::cli
