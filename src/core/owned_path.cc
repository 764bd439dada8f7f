#include "core/owned_path.h"

#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>

namespace corral::core {

namespace {

std::string user_name(uid_t uid) {
  passwd pw{}, *found = nullptr;
  char buf[1024];
  if (getpwuid_r(uid, &pw, buf, sizeof buf, &found) == 0 && found)
    return fmt::format("uid {} ({})", uid, found->pw_name);
  return fmt::format("uid {}", uid);
}

Error unsafe(const std::string& path, const std::string& why) {
  return Error{kErrorUnsafePath, path + ": " + why};
}

// Checks the owner and mode of what `st` describes (`path` for the message).
Result<void> check_stat(const std::string& path, const struct stat& st, bool directory) {
  uid_t me = geteuid();
  if (directory ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
    return unsafe(path, directory ? "not a directory" : "not a regular file");
  if (st.st_uid != me)
    return unsafe(path, "owned by " + user_name(st.st_uid) + ", not by " + user_name(me) +
                            " running corral (chown it, or use another --state-dir)");
  if (st.st_mode & (S_IWGRP | S_IWOTH))
    return unsafe(path,
                  fmt::format("writable by {} (mode {:04o}; chmod go-w it)",
                              (st.st_mode & S_IWOTH) ? "others" : "its group", st.st_mode & 07777));
  return {};
}

}  // namespace

Result<void> check_owned(const std::string& path, bool directory) {
  struct stat st;
  if (::lstat(path.c_str(), &st) < 0) return errno_error(path.c_str());
  if (S_ISLNK(st.st_mode)) {
    if (st.st_uid != geteuid())
      return unsafe(path, "a symbolic link owned by " + user_name(st.st_uid) + ", not by " +
                              user_name(geteuid()) + " running corral");
    if (::stat(path.c_str(), &st) < 0) return errno_error(path.c_str());
  }
  return check_stat(path, st, directory);
}

Result<void> ensure_owned_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0700) == 0) return check_owned(path, true);
  if (errno != EEXIST) return errno_error(("create " + path).c_str());
  return check_owned(path, true);
}

Result<void> check_owned_if_present(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) < 0 && errno == ENOENT) return {};
  return check_owned(path, false);
}

}  // namespace corral::core
