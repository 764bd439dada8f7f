#include "quic/bpf_steering.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <utility>

static_assert(LIBBPF_MAJOR_VERSION == 1, "written against libbpf 1.x (Debian 12 has 1.1)");

#ifndef SO_ATTACH_REUSEPORT_EBPF
#define SO_ATTACH_REUSEPORT_EBPF 52
#endif

// The object file built from bpf/steer.bpf.c, embedded by steer_bpf_object.cc (generated).
extern "C" const unsigned char corral_steer_bpf_object[];
extern "C" const unsigned char corral_steer_bpf_object_end[];

namespace corral::quic {

namespace {

// Must match struct steer_cfg in bpf/steer.bpf.c.
struct SteerCfg {
  uint32_t tag;
  uint32_t seed;
  uint32_t slots;
};

// libbpf prints through one process-wide hook; while we load, it goes to our log (and the last
// warning is kept for the error text).
core::Logger* g_log = nullptr;
std::string* g_last = nullptr;

int print_to_log(enum libbpf_print_level level, const char* format, va_list args) {
  char line[512];
  int n = vsnprintf(line, sizeof line, format, args);
  if (n <= 0) return 0;
  std::string_view text(line, std::min<size_t>(static_cast<size_t>(n), sizeof line - 1));
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  if (text.starts_with("libbpf: ")) text.remove_prefix(8);
  // Warnings become part of the error text (the caller logs that once); everything is also in our
  // log at debug level, never on stderr.
  if (level == LIBBPF_WARN && g_last && g_last->size() < 600 &&
      text.find("failed to load object") == std::string_view::npos) {
    if (!g_last->empty()) *g_last += "; ";
    *g_last += text;
  }
  if (g_log)
    g_log->debug("libbpf", "level={} message=\"{}\"", level == LIBBPF_WARN ? "warn" : "info", text);
  return 0;
}

struct PrintScope {
  PrintScope(core::Logger* log, std::string* last) {
    g_log = log;
    g_last = last;
    previous = libbpf_set_print(print_to_log);
  }
  ~PrintScope() {
    libbpf_set_print(previous);
    g_log = nullptr;
    g_last = nullptr;
  }
  libbpf_print_fn_t previous;
};

core::Error failure(const char* step, int err, const std::string& detail) {
  err = err < 0 ? -err : err;
  std::string reason;
  // EPERM/EACCES also come from the verifier; only say "no CAP_BPF" when that is the cause.
  bool no_capability = (err == EPERM || err == EACCES) && !has_bpf_capability();
  if (no_capability) reason = "no CAP_BPF: ";
  reason += step;
  reason += ": ";
  reason += strerror(err);
  // Without the capability libbpf's lines (a failed probe, RLIMIT_MEMLOCK advice) only mislead.
  if (!detail.empty() && !no_capability) reason += " (libbpf: " + detail + ")";
  return core::Error{err, std::move(reason)};
}

}  // namespace

bool has_bpf_capability() {
  FILE* f = fopen("/proc/self/status", "re");
  if (!f) return false;
  char line[256];
  unsigned long long eff = 0;
  bool found = false;
  while (fgets(line, sizeof line, f))
    if (sscanf(line, "CapEff: %llx", &eff) == 1) {
      found = true;
      break;
    }
  fclose(f);
  constexpr int kCapSysAdmin = 21, kCapBpf = 39;
  return found && ((eff >> kCapBpf) & 1 || (eff >> kCapSysAdmin) & 1);
}

BpfSteering::BpfSteering(BpfSteering&& other) noexcept
    : obj_(std::exchange(other.obj_, nullptr)),
      socks_fd_(std::exchange(other.socks_fd_, -1)),
      cfg_fd_(std::exchange(other.cfg_fd_, -1)),
      prog_fd_(std::exchange(other.prog_fd_, -1)) {}

BpfSteering& BpfSteering::operator=(BpfSteering&& other) noexcept {
  if (this != &other) {
    if (obj_) bpf_object__close(obj_);
    obj_ = std::exchange(other.obj_, nullptr);
    socks_fd_ = std::exchange(other.socks_fd_, -1);
    cfg_fd_ = std::exchange(other.cfg_fd_, -1);
    prog_fd_ = std::exchange(other.prog_fd_, -1);
  }
  return *this;
}

BpfSteering::~BpfSteering() {
  if (obj_) bpf_object__close(obj_);  // the attached program lives on with the group's sockets
}

core::Result<void> BpfSteering::set_slot(uint32_t slot, int fd) {
  uint64_t value = static_cast<uint64_t>(fd);
  if (bpf_map_update_elem(socks_fd_, &slot, &value, BPF_ANY) < 0)
    return failure("socks update", errno, {});
  return {};
}

core::Result<BpfSteering> load_bpf_steering(const std::vector<int>& udp_fds, const SteeringKey& key,
                                            core::Logger* log) {
  if (udp_fds.empty() || udp_fds.size() != key.slots || key.slots > kMaxSlots)
    return core::Error{
        EINVAL, "BPF steering needs one socket per slot (1.." + std::to_string(kMaxSlots) + ")"};
  std::string last;
  PrintScope scope(log, &last);

  BpfSteering s;
  bpf_object_open_opts opts{};
  opts.sz = sizeof opts;
  opts.object_name = "corral_steer";
  size_t size = static_cast<size_t>(corral_steer_bpf_object_end - corral_steer_bpf_object);
  s.obj_ = bpf_object__open_mem(corral_steer_bpf_object, size, &opts);
  if (!s.obj_) return failure("open", errno, last);
  if (int err = bpf_object__load(s.obj_); err) {
    bpf_object__close(std::exchange(s.obj_, nullptr));
    return failure("load", err, last);
  }
  bpf_program* prog = bpf_object__find_program_by_name(s.obj_, "steer");
  bpf_map* socks = bpf_object__find_map_by_name(s.obj_, "socks");
  bpf_map* cfg = bpf_object__find_map_by_name(s.obj_, "cfg");
  if (!prog || !socks || !cfg)
    return core::Error{ENOENT, "the embedded BPF object lacks steer/socks/cfg"};
  s.prog_fd_ = bpf_program__fd(prog);
  s.socks_fd_ = bpf_map__fd(socks);
  s.cfg_fd_ = bpf_map__fd(cfg);

  SteerCfg c{key.tag, key.seed, key.slots};
  uint32_t zero = 0;
  if (bpf_map_update_elem(s.cfg_fd_, &zero, &c, BPF_ANY) < 0)
    return failure("cfg update", errno, last);
  for (uint32_t i = 0; i < udp_fds.size(); ++i) {
    if (auto r = s.set_slot(i, udp_fds[i]); !r)
      return core::Error{r.error().code, "slot " + std::to_string(i) + ": " + r.error().reason};
  }
  if (setsockopt(udp_fds[0], SOL_SOCKET, SO_ATTACH_REUSEPORT_EBPF, &s.prog_fd_, sizeof s.prog_fd_) <
      0)
    return failure("attach", errno, {});
  return s;
}

}  // namespace corral::quic
