#include "cli/flag_docs.h"

namespace corral::cli {

namespace {

std::string escape_cell(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (c == '|') out += '\\';
    out += c == '\n' ? ' ' : c;
  }
  return out;
}

std::string option_names(const CLI::Option& opt) {
  if (opt.get_positional()) return opt.get_name();
  std::string names;
  for (const auto& n : opt.get_lnames()) names += (names.empty() ? "" : ", ") + ("--" + n);
  for (const auto& n : opt.get_snames()) names += (names.empty() ? "" : ", ") + ("-" + n);
  return names;
}

}  // namespace

std::string flag_tables_markdown(const CLI::App& app) {
  std::string out;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->get_group().empty()) continue;  // hidden
    out += "`corral " + sub->get_name() + "`: " + escape_cell(sub->get_description()) + "\n\n";
    out += "| flag | value | what |\n| --- | --- | --- |\n";
    for (const CLI::Option* opt : sub->get_options()) {
      if (opt == sub->get_help_ptr() || opt->get_group().empty()) continue;
      std::string value = opt->get_type_name();
      out += "| `" + option_names(*opt) + "` | " + (value.empty() ? "" : "`" + value + "`") +
             " | " + escape_cell(opt->get_description()) + " |\n";
    }
    out += "\n";
  }
  if (!out.empty()) out.pop_back();  // one trailing newline
  return out;
}

}  // namespace corral::cli
