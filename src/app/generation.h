// Generation: the options one generation of server processes runs with, and what the supervisor
// learnt while making its listeners (the TLS port as bound, which HTTP/3 advertises). A SIGHUP
// that is accepted makes the next one.
//
// Lifetime: shared (std::shared_ptr<const Generation>) between the Supervision, which holds the
// current one, and the fan-out's ChildMain of each generation, which forks (and re-forks, on a
// crash) that generation's processes until a newer one replaces it. Immutable once shared.
#pragma once

#include "app/app.h"

namespace corral::app {

struct Generation {
  Options options;
  int tls_port = 0;  // the TLS listener's port as bound (HTTP/3 listens on it over UDP)
};

}  // namespace corral::app
