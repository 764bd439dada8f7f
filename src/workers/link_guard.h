// The last resort at a link boundary, shared by both ends of the server-process <-> supervisor
// link: a handler's exception is logged on stderr (escaped) and the message dropped, rather than
// reaching std::terminate and taking the process down. Header-only; no state.
#pragma once

#include <exception>
#include <string_view>

#include "core/log.h"

namespace corral::workers {

template <typename F>
void guarded(std::string_view where, F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    core::Logger log(2);
    log.error("link_message_failed", "where={} error=\"{}\"", where, e.what());
  } catch (...) {
    core::Logger log(2);
    log.error("link_message_failed", "where={} error=\"unknown exception\"", where);
  }
}

}  // namespace corral::workers
