// SessionPtr: an owning pointer to a tls::Session that does not need the Session's definition (or
// GnuTLS's headers), so the HTTP connection, the upgrade context and the WebSocket can carry one
// without every includer of http/ seeing GnuTLS.
#pragma once

#include <memory>

namespace corral::tls {

class Session;
struct SessionDelete {
  void operator()(Session* s) const;
};
using SessionPtr = std::unique_ptr<Session, SessionDelete>;

}  // namespace corral::tls
