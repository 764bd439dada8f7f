// The sites the `corral` program serves by itself: the embedded welcome site (no DIR given) and a
// static directory (corral serve DIR).
#pragma once

#include <string>

#include "http/site.h"

namespace corral::cli {

// GET / (the welcome page), /favicon.ico and the example routes it lists. `demo_item`: the page's
// list item for the notes demo (src/cli/demo.h demo_welcome_item: its link, or why it is
// unavailable), HTML; empty for none. `version`: corral's, said at the foot of the page.
void add_welcome_routes(http::SiteBuilder& site, std::string demo_item = {},
                        std::string version = {});
// The welcome site's WebSocket echo at /ws/echo.
void add_welcome_sockets(http::SiteBuilder& site);
// GET /* serves files beneath `root`; dotfiles are 404 unless `serve_dotfiles`.
void add_static_routes(http::SiteBuilder& site, const std::string& root,
                       bool serve_dotfiles = false);

// `Corral-Process: slot=S pid=P` on every response (config `server.process_header`): which server
// process answered, for tests and debugging of the fan-out. The slot is set by each process after
// the fork (set_process_slot); the site itself is built once, before.
void add_process_header(http::SiteBuilder& site);
void set_process_slot(int slot);

}  // namespace corral::cli
