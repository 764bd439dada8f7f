// Owned paths: what corral trusts on disk must belong to the user running it.
//
// corral keeps its state in a directory (`--state-dir`, default $XDG_STATE_HOME/corral or
// ./.corral): the dev certificate and key, the control socket, the workers' sockets, locks and
// logs. Whoever can write there can make corral serve their key or talk to their socket, so a
// path corral takes from there must be owned by the effective user and not writable by group or
// others; anything else is refused with a message naming the path (never adopted, never chmod-ed
// into shape). Checked with lstat: a symbolic link is followed only if it is itself owned by the
// user (the target is then checked the same way). Missing directories are created 0700.
//
// Stateless functions; they only read the filesystem (ensure_owned_dir also creates).
#pragma once

#include <string>

#include "core/result.h"

namespace corral::core {

// Error::code of a path that exists but is not safely ours (wrong owner, group/other writable,
// a link of someone else's, not the expected type).
constexpr int kErrorUnsafePath = 0x10000 + 1;

// `path` must exist, be a directory (`directory`) or a regular file, be owned by geteuid() and
// carry no group/other write bit.
Result<void> check_owned(const std::string& path, bool directory);
// Like check_owned(path, true) when `path` exists; else creates it 0700 (its parent must exist).
Result<void> ensure_owned_dir(const std::string& path);
// check_owned(path, false) when `path` exists; a missing file is fine (the caller makes it).
Result<void> check_owned_if_present(const std::string& path);

}  // namespace corral::core
