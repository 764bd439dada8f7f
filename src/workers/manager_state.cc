// The Manager's state as JSON (workers/manager.h, state()): an address's entry, the whole map,
// the stderr tail, and the change events its watchers get.
#include "workers/manager_impl.h"

#include <algorithm>
#include <cstdint>

namespace corral::workers {

using namespace detail;

namespace {

// A count of a `ready` or `idle` message: a non-negative integer, else 0.
uint64_t count_of(const nlohmann::json& msg, const char* key) {
  auto it = msg.find(key);
  return it != msg.end() && it->is_number_unsigned() ? it->get<uint64_t>() : 0;
}

}  // namespace

void Manager::record_holds(Worker& w, const nlohmann::json& msg) {
  // A worker that never sends counts (an older library) has no `holds` in its entry.
  if (!msg.contains("requests") && !msg.contains("upgraded") && !msg.contains("busy")) return;
  w.holds =
      Worker::Holds{count_of(msg, "requests"), count_of(msg, "upgraded"), count_of(msg, "busy")};
}

// Why a running worker is alive ("holds"; issue 14): what its last report counted, when it went
// idle and when the idle stop comes (null while it is not idle). The idle check runs every
// idle_check_ms, so the stop comes up to that much after idle_stop_at; past it, a connection
// waiting in its socket's accept queue (a request it has not taken yet) holds it.
void Manager::add_why_alive(const Worker& w, nlohmann::json& e) const {
  if (w.holds)
    e["holds"] = {
        {"requests", w.holds->requests}, {"upgraded", w.holds->upgraded}, {"busy", w.holds->busy}};
  if (!w.idle) {
    e["idle_since"] = nullptr;
    e["idle_stop_at"] = nullptr;
    return;
  }
  const uint32_t idle_ms = w.home->kind->config.idle_ms;
  e["idle_since"] = iso8601(w.idle_since_wall);
  e["idle_stop_at"] = iso8601(w.idle_since_wall + static_cast<time_t>((idle_ms + 999) / 1000));
  if (loop_.now() - w.idle_since >= idle_ms && connection_waiting(w))
    e["idle_stop_delayed"] = "a connection waits in the worker's accept queue";
}

nlohmann::json Manager::entry(const std::string& address) const {
  const Home* home = find(address);
  return home ? entry_of(*home) : nlohmann::json();
}

// The `status` of the home's entry; "" when it has none.
std::string_view Manager::status_of(const Home& home) {
  if (!home.failed.is_null()) return "failed";
  if (const Worker* w = home.worker.get())
    return w->stopping ? "stopping" : w->ready ? "running" : "starting";
  if (home.queued) return "queued";
  if (home.suspended) return "suspended";
  return "";
}

nlohmann::json Manager::entry_of(const Home& home) const {
  nlohmann::json e;
  if (!home.failed.is_null()) {
    e = {{"status", "failed"}, {"error", home.failed}, {"at", iso8601(home.failed_at)}};
    if (home.kind) e["log"] = options_.state_dir + "/logs/" + home.kind->config.name + ".log";
  } else if (const Worker* w = home.worker.get()) {
    e = {{"status", status_of(home)}, {"pid", w->pid}, {"startedAt", iso8601(w->started_at)}};
    if (!w->version.empty()) e["version"] = w->version;
    if (w->ready && !w->stopping) add_why_alive(*w, e);
  } else if (home.queued) {
    e = {{"status", "queued"}, {"queuedAt", iso8601(home.queued_at)}};
  } else if (home.suspended) {
    e = {{"status", "suspended"}};
  }
  if (home.suspended) e["suspended"] = true;
  return e;
}

nlohmann::json Manager::state() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [address, home] : homes_) {
    auto e = entry_of(*home);
    if (!e.is_null()) out[core::wire_encode(address)] = std::move(e);
  }
  return out;
}

void Manager::record_start_latency(Kind& kind, uint64_t ms, bool from_spare) {
  kind.counters.ready(from_spare, ms);
  auto v = static_cast<uint32_t>(std::min<uint64_t>(ms, UINT32_MAX));
  if (kind.start_latencies.size() < kKindStartSamples) {
    kind.start_latencies.push_back(v);
  } else {
    kind.start_latencies[kind.start_latency_next] = v;
    kind.start_latency_next = (kind.start_latency_next + 1) % kKindStartSamples;
  }
}

std::vector<Manager::KindSummary> Manager::kind_summaries() const {
  std::vector<KindSummary> out(kinds_.size());
  for (const auto& kind : kinds_) {
    KindSummary& k = out[kind->index];
    k.name = kind->config.name;
    if (kind->config.code) k.version = kind->config.code->version;
    k.rolling = kind->rollout != nullptr;
    k.spares = kind->spares.size();
    // The ring from its oldest sample on.
    const auto& ring = kind->start_latencies;
    k.start_ms.reserve(ring.size());
    for (size_t i = 0; i < ring.size(); ++i)
      k.start_ms.push_back(ring[(kind->start_latency_next + i) % ring.size()]);
  }
  for (const auto& [address, home] : homes_) {
    KindSummary& k = out[home->kind->index];
    const Worker* w = home->worker.get();
    std::string_view status = status_of(*home);
    if (status == "starting") ++k.starting;
    if (status == "running") ++k.running;
    if (status == "stopping") ++k.stopping;
    if (status == "queued") ++k.queued;
    if (status == "failed") ++k.failed;
    if (home->suspended) ++k.suspended;
    if (w) ++k.live;
    if (w && !w->stopping && w->version != k.version) ++k.stale;
  }
  return out;
}

void Manager::visit_counters(const CountersVisitor& visit) const {
  for (const auto& kind : kinds_) visit(kind->config.name, kind->counters);
}

void Manager::visit_addresses(const AddressVisitor& visit) const {
  for (const auto& [address, home] : homes_) {
    std::string_view status = status_of(*home);
    if (!status.empty()) visit(address, home->kind->config.name, status);
  }
}

std::string Manager::stderr_tail(const std::string& address) const {
  const Home* home = find(address);
  return home ? home->tail : std::string();
}

void Manager::changed(Home& home) {
  nlohmann::json e = entry_of(home);
  if (e == home.last_emitted) return;
  home.last_emitted = e;
  emit(home.address, e);
}

void Manager::emit(const std::string& address, const nlohmann::json& e) {
  // A watcher may unwatch (itself or another) from its callback: walk a snapshot of the ids.
  std::vector<uint64_t> ids;
  for (const auto& [id, cb] : watchers_) ids.push_back(id);
  for (uint64_t id : ids) {
    auto it = watchers_.find(id);
    if (it != watchers_.end()) it->second(address, e);
  }
  if (on_change) on_change(address, e);
}

void Manager::settle(Home& home) {
  changed(home);
  if (home.worker || !home.waiters.empty() || home.start_queued || home.queued ||
      !home.failed.is_null() || home.suspended)
    return;
  rollout_on_gone(home);
  std::string key = home.address;
  homes_.erase(key);  // destroys `home`; its last emitted entry was null
}

uint64_t Manager::watch(ChangeCallback cb) {
  uint64_t id = next_watch_++;
  watchers_.emplace(id, std::move(cb));
  return id;
}

void Manager::unwatch(uint64_t id) {
  watchers_.erase(id);
}

std::optional<Manager::LogFile> Manager::log_file(std::string_view address) const {
  const Kind* kind = kind_of(address);
  if (!kind) return std::nullopt;
  return LogFile{options_.state_dir + "/logs/" + kind->config.name + ".log",
                 kind->config.log_rotation.keep};
}

uint64_t Manager::watch_output(OutputCallback cb) {
  uint64_t id = next_watch_++;
  output_watchers_.emplace(id, std::move(cb));
  return id;
}

void Manager::unwatch_output(uint64_t id) {
  output_watchers_.erase(id);
}

}  // namespace corral::workers
