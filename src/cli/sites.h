// The sites the `corral` program serves by itself: the embedded welcome site (no DIR given) and a
// static directory (corral serve DIR).
#pragma once

#include <string>

#include "http/site.h"

namespace corral::cli {

// With `demo`, the page links the notes demo (src/cli/demo.h).
void add_welcome_routes(http::SiteBuilder& site, bool demo = false);
// The welcome site's WebSocket echo at /ws/echo.
void add_welcome_sockets(http::SiteBuilder& site);
void add_static_routes(http::SiteBuilder& site, const std::string& root);

}  // namespace corral::cli
