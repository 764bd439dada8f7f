#include "tls/acme_board.h"

#include <sys/mman.h>

#include <cstring>
#include <new>

namespace corral::tls {

namespace {
struct Slot {
  char type[16];
  char domain[256];
  char token[128];
  char key_authorization[256];
};

bool put(char* out, size_t size, const std::string& in) {
  if (in.size() >= size) return false;
  std::memcpy(out, in.data(), in.size());
  out[in.size()] = '\0';
  return true;
}
}  // namespace

struct AcmeBoard::Shared {
  std::atomic<uint64_t> cert_version{0};
  std::atomic<uint32_t> sequence{0};  // odd while the writer changes the answers
  uint32_t count = 0;
  Slot slots[kMaxAnswers];
};

core::Result<std::shared_ptr<AcmeBoard>> AcmeBoard::create(std::string dir,
                                                           bool refuse_until_issued) {
  void* p =
      ::mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return core::errno_error("acme board mmap");
  std::shared_ptr<AcmeBoard> b(new AcmeBoard());
  b->shared_ = new (p) Shared();
  b->dir_ = std::move(dir);
  b->refuse_until_issued_ = refuse_until_issued;
  return b;
}

AcmeBoard::~AcmeBoard() {
  if (shared_) ::munmap(shared_, sizeof(Shared));
}

void AcmeBoard::publish_answers(const std::vector<Answer>& answers) {
  Shared& s = *shared_;
  s.sequence.fetch_add(1, std::memory_order_acq_rel);
  std::atomic_thread_fence(std::memory_order_release);
  uint32_t n = 0;
  for (const auto& a : answers) {
    if (n == kMaxAnswers) break;
    Slot& slot = s.slots[n];
    if (put(slot.type, sizeof slot.type, a.type) &&
        put(slot.domain, sizeof slot.domain, a.domain) &&
        put(slot.token, sizeof slot.token, a.token) &&
        put(slot.key_authorization, sizeof slot.key_authorization, a.key_authorization))
      ++n;
  }
  s.count = n;
  std::atomic_thread_fence(std::memory_order_release);
  s.sequence.fetch_add(1, std::memory_order_acq_rel);
}

void AcmeBoard::publish_certificate() {
  shared_->cert_version.fetch_add(1, std::memory_order_acq_rel);
}

uint64_t AcmeBoard::certificate_version() const {
  return shared_->cert_version.load(std::memory_order_acquire);
}

std::optional<std::string> AcmeBoard::find(std::string_view type, std::string_view domain,
                                           std::string_view token) const {
  const Shared& s = *shared_;
  for (int attempt = 0; attempt < 100; ++attempt) {
    uint32_t before = s.sequence.load(std::memory_order_acquire);
    if (before & 1) continue;
    std::optional<std::string> found;
    uint32_t n = std::min<uint32_t>(s.count, kMaxAnswers);
    for (uint32_t i = 0; i < n && !found; ++i) {
      Slot slot;
      std::memcpy(&slot, &s.slots[i], sizeof slot);
      slot.type[sizeof slot.type - 1] = slot.domain[sizeof slot.domain - 1] = '\0';
      slot.token[sizeof slot.token - 1] = '\0';
      slot.key_authorization[sizeof slot.key_authorization - 1] = '\0';
      if (type != slot.type) continue;
      if (!domain.empty() && domain != slot.domain) continue;
      if (!token.empty() && token != slot.token) continue;
      found = std::string(slot.key_authorization);
    }
    std::atomic_thread_fence(std::memory_order_acquire);
    if (s.sequence.load(std::memory_order_acquire) == before) return found;
  }
  return std::nullopt;  // the writer kept changing it: the CA asks again
}

std::optional<std::string> AcmeBoard::http01(std::string_view token) const {
  if (token.empty()) return std::nullopt;
  return find("http-01", {}, token);
}

std::optional<std::string> AcmeBoard::tls_alpn01(std::string_view domain) const {
  if (domain.empty()) return std::nullopt;
  return find("tls-alpn-01", domain, {});
}

}  // namespace corral::tls
