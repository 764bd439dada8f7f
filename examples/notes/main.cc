// corral-notes-worker: one note per address (`note:<id>`), a worker process each, its state in a
// SQLite file per address. `corral serve` with no arguments runs it as the demo on "/note/{id}/*"
// (src/cli/demo.h); any config can declare it as a kind:
//
//   [workers.note]
//   command = ["/path/to/corral-notes-worker"]
//   routes = ["/note/{id}/*"]
//
//   GET  /      an HTML page: the note in a textarea, edited live (inline script and style under
//               the response's CSP nonce); every tab on the note is a WebSocket on /ws
//   GET  /ws    the note live (WebSocket, JSON text messages; below)
//   GET  /text  the text (text/plain)
//   POST /text  replaces the text with the request body; answers the new revision (and every
//               open socket gets the new text)
//   GET  /rev   the revision (0 for a note never written)
//   GET  /favicon.svg  the page's icon
//
// The file is <state dir>/notes/<address percent-encoded>.sqlite ("note%3Aa.sqlite": a key can
// hold any byte, "/" and ".." included; the page names it by its absolute path), the directory
// created 0700. A save is acknowledged only once it is durable: one SQLite transaction writes the
// text and its revision together and commits before the answer. The database is in WAL mode with
// synchronous=FULL: each commit fsyncs the WAL, so an acknowledged save survives a kill -9 of the
// worker and a power cut alike (NORMAL would survive only the first). The revision is read from the
// file in the same transaction, so it never goes backwards; a worker that starts reads both back.
// The memory holds a copy of what is committed, for reads. Only one worker runs per address (the
// address's lock).
//
// Live editing (GET /ws). The worker holds the note and every browser tab on it is a socket on
// this one process, so an edit is ordered, committed and passed on in one place. Messages:
//
//   server -> a new socket     {"text", "rev", "you": <this socket's id>, "pid": <the worker's>}
//   client -> server           {"text": <the whole new text>, "base": <the rev it edited>}
//   server -> the sender       {"ack": rev}   once the edit is committed (fsynced), never before
//   server -> every other one  {"text", "rev", "from": <the sender's id; 0: POST /text>}
//   server -> the sender       {"text", "rev", "stale": true}  when base is not the current rev:
//                              nothing was written; the client merges and sends again
//   server -> the sender       {"error": "..."}  a message that is not an edit, or a failed commit
//
// Last writer wins on the whole text, with revisions: an edit made on an old revision is refused,
// so a tab never overwrites a change it has not seen (the page merges its own change onto the
// newer text and sends again). An open socket holds the worker alive (the worker library counts
// upgraded connections as not idle); the page reconnects when its socket closes.
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/escape.h"
#include "http/percent.h"
#include "worker/worker.h"
#include "ws/socket.h"

namespace {

using namespace corral;

// Every byte but the RFC 3986 unreserved ones as %XX, with a hash instead of the tail of a long
// one (as the lock's name): a bounded, safe file name for any address (core/escape.h).
std::string file_name_for(std::string_view address) {
  return core::bounded_file_name(address, 200);
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char ch : s) {
    switch (ch) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

// A SQLite handle and the one row of the note.
class NoteFile {
 public:
  explicit NoteFile(std::string path) : path_(std::move(path)) {
    // Created 0600 here (SQLite would use 0644 less the umask; its journal copies these bits).
    int fd = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) throw std::runtime_error("cannot open " + path_ + ": " + std::strerror(errno));
    ::close(fd);
    sqlite3* db = nullptr;
    int rc =
        sqlite3_open_v2(path_.c_str(), &db,
                        SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
    db_.reset(db);  // closed by the deleter even when the open failed
    if (rc != SQLITE_OK) fail("open");
    sqlite3_busy_timeout(db_.get(), 2'000);
    // WAL: a commit appends to the log (one fsync with FULL) instead of rewriting pages through a
    // rollback journal; readers (the tests' sqlite3) do not block the writer.
    {
      Statement st(*this, "PRAGMA journal_mode = WAL");
      if (sqlite3_step(st.get()) != SQLITE_ROW) fail("journal_mode");
      const auto* mode = reinterpret_cast<const char*>(sqlite3_column_text(st.get(), 0));
      if (!mode || std::string_view(mode) != "wal")
        throw std::runtime_error("sqlite " + path_ + ": WAL mode refused (journal_mode " +
                                 (mode ? mode : "?") + ")");
    }
    exec("PRAGMA synchronous = FULL");
    exec(
        "CREATE TABLE IF NOT EXISTS note ("
        " id INTEGER PRIMARY KEY CHECK (id = 1),"
        " text TEXT NOT NULL,"
        " rev INTEGER NOT NULL)");
  }

  // The stored text and revision; ("", 0) when the note was never written.
  void load(std::string& text, int64_t& rev) {
    Statement st(*this, "SELECT text, rev FROM note WHERE id = 1");
    int rc = sqlite3_step(st.get());
    if (rc == SQLITE_ROW) {
      const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st.get(), 0));
      text.assign(p ? p : "", static_cast<size_t>(sqlite3_column_bytes(st.get(), 0)));
      rev = sqlite3_column_int64(st.get(), 1);
    } else if (rc == SQLITE_DONE) {
      text.clear();
      rev = 0;
    } else {
      fail("read");
    }
  }

  // Replaces the text; returns the new revision (the stored one + 1), once committed. Throws
  // (and nothing changed) when it could not be committed.
  int64_t save(std::string_view text) {
    exec("BEGIN IMMEDIATE");  // the write lock now: the revision read below is the latest
    try {
      std::string old;
      int64_t rev = 0;
      load(old, rev);
      ++rev;
      Statement st(*this,
                   "INSERT INTO note (id, text, rev) VALUES (1, ?1, ?2)"
                   " ON CONFLICT (id) DO UPDATE SET text = excluded.text, rev = excluded.rev");
      if (sqlite3_bind_text64(st.get(), 1, text.data(), text.size(), SQLITE_TRANSIENT,
                              SQLITE_UTF8) != SQLITE_OK ||
          sqlite3_bind_int64(st.get(), 2, rev) != SQLITE_OK ||
          sqlite3_step(st.get()) != SQLITE_DONE)
        fail("write");
      exec("COMMIT");
      return rev;
    } catch (...) {
      sqlite3_exec(db_.get(), "ROLLBACK", nullptr, nullptr, nullptr);  // when still open
      throw;
    }
  }

  // Closes the handle now (a failed close is reported; the deleter would only try again).
  void close() {
    sqlite3* db = db_.release();
    if (db && sqlite3_close(db) != SQLITE_OK) {
      std::string msg = sqlite3_errmsg(db);
      sqlite3_close_v2(db);
      throw std::runtime_error("sqlite close " + path_ + ": " + msg);
    }
  }

 private:
  struct Closer {
    void operator()(sqlite3* db) const { sqlite3_close_v2(db); }
  };
  class Statement {
   public:
    Statement(NoteFile& f, const char* sql) {
      if (sqlite3_prepare_v2(f.db_.get(), sql, -1, &st_, nullptr) != SQLITE_OK) f.fail("prepare");
    }
    ~Statement() { sqlite3_finalize(st_); }
    Statement(const Statement&) = delete;
    Statement& operator=(const Statement&) = delete;
    sqlite3_stmt* get() const { return st_; }

   private:
    sqlite3_stmt* st_ = nullptr;
  };

  void exec(const char* sql) {
    if (sqlite3_exec(db_.get(), sql, nullptr, nullptr, nullptr) != SQLITE_OK) fail("exec");
  }
  [[noreturn]] void fail(const char* what) {
    throw std::runtime_error(fmt::format("sqlite {} {}: {}", what, path_,
                                         db_ ? sqlite3_errmsg(db_.get()) : "out of memory"));
  }

  std::string path_;
  std::unique_ptr<sqlite3, Closer> db_;
};

// A message for a socket: JSON, with any byte the text holds that is not UTF-8 (a POST /text
// body may have some) replaced by U+FFFD rather than a throw.
std::string to_message(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The committed note, the file it is committed to, and the sockets open on it (the tabs).
struct Note {
  std::unique_ptr<NoteFile> file;
  std::string text;
  int64_t rev = 0;
  // Each open socket and its id (1, 2, ...; 0 is "not a socket": POST /text). A socket is
  // forgotten in its on_close, before it is destroyed.
  std::unordered_map<ws::Socket*, uint64_t> tabs;
  uint64_t next_tab = 1;

  // Throws when the save could not be committed: the route answers 500, the copy is unchanged.
  int64_t save(std::string_view new_text) {
    int64_t r = file->save(new_text);
    text.assign(new_text);
    rev = r;
    return r;
  }

  // The committed state to every socket but `except`.
  void broadcast(uint64_t from, const ws::Socket* except) {
    std::string msg = to_message({{"text", text}, {"rev", rev}, {"from", from}});
    // A copy: a send that passes a socket's output cap drops it, and its on_close edits `tabs`.
    std::vector<ws::Socket*> to;
    to.reserve(tabs.size());
    for (const auto& [s, id] : tabs)
      if (s != except) to.push_back(s);
    for (ws::Socket* s : to)
      if (tabs.count(s)) s->send_text(msg);
  }

  // One message from a tab: an edit committed, then acknowledged, then passed on; or refused.
  void on_message(ws::Socket& s, std::string_view data, bool binary, core::Logger& log) {
    auto j = binary ? nlohmann::json() : nlohmann::json::parse(data, nullptr, false);
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string() || !j.contains("base") ||
        !j["base"].is_number_integer()) {
      s.send_text(to_message({{"error", "not an edit: {\"text\": string, \"base\": rev}"}}));
      return;
    }
    if (j["base"].get<int64_t>() != rev) {  // made on a revision that is not the latest
      s.send_text(to_message({{"text", text}, {"rev", rev}, {"stale", true}}));
      return;
    }
    try {
      save(j["text"].get_ref<const std::string&>());  // committed (fsynced) before the ack
    } catch (const std::exception& e) {  // nothing changed; no exception leaves the loop's callback
      log.error("note_save_failed", "error=\"{}\"", e.what());
      s.send_text(to_message({{"error", "the note's storage failed"}}));
      return;
    }
    s.send_text(to_message({{"ack", rev}}));
    broadcast(tabs.count(&s) ? tabs[&s] : 0, &s);
  }
};

constexpr std::string_view kPage = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="favicon.svg" type="image/svg+xml">
<style nonce="{nonce}">body{{font:16px/1.5 system-ui,sans-serif;max-width:42rem;margin:3rem auto;padding:0 1rem}}textarea{{width:100%;min-height:14rem;font:inherit}}#status,footer{{color:#666}}footer{{font-size:.9em}}code{{background:#eee;padding:0 .2em;overflow-wrap:anywhere}}</style>
</head><body>
<h1>{title}</h1>
<p>A note served by its own worker process (address <code>{address}</code>, pid
<span id="pid">{pid}</span>). Every tab open on it is a WebSocket to that process: what you type is
sent as you type, committed to <code id="file">{file}</code> (SQLite, WAL, synchronous=FULL) before
it is acknowledged, and shown at once in the other tabs. Open this page twice to see it.</p>
<textarea id="text" spellcheck="false" data-rev="{rev}">{text}</textarea>
<p id="status">revision {rev}</p>
<footer><p>corral {version}: the notes demo (<code>examples/notes/main.cc</code>). The documentation
is in corral's source tree: <code>README.md</code>, <code>docs/worker-protocol.md</code> (what a
worker speaks) and the rest of <code>docs/</code>.</p></footer>
<script nonce="{nonce}">{script}</script>
</body></html>
)";

// The page's icon (a fence, as corral's welcome page has), at favicon.svg beside the page.
constexpr std::string_view kFavicon =
    R"(<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">)"
    R"(<rect width="32" height="32" rx="6" fill="#2a5d8f"/>)"
    R"(<path d="M6 11h20M6 21h20M9 6v20M16 6v20M23 6v20" stroke="#fff" stroke-width="2.5")"
    R"( stroke-linecap="round"/></svg>)";

// The page's script (not a format string: braces as they are). `base`/`baseText` are the last
// committed state this tab knows; `sent` the text of the edit in flight (one at a time). An edit
// of another tab arrives as a committed state: this tab's own change since `baseText` is merged
// onto it (kept where the two touch different places; where they overlap, the other's text is
// kept and this tab's inserted text put after it) and sent again on the new revision.
constexpr std::string_view kScript = R"JS(
const area = document.getElementById('text'), status = document.getElementById('status');
const pid = document.getElementById('pid');
let base = Number(area.dataset.rev), baseText = area.value, sent = null;
let ws = null, timer = 0, retryMs = 250, wasSaved = false;
const say = (s) => { status.textContent = s; };

// The one splice that turns a into b: [start, end in a, inserted text], never inside a
// surrogate pair (a lone half would not survive the JSON to the worker).
const high = (t, i) => i > 0 && i < t.length && (t.charCodeAt(i - 1) & 0xfc00) === 0xd800;
function splice(a, b) {
  let s = 0;
  while (s < a.length && s < b.length && a[s] === b[s]) s++;
  if (high(a, s) || high(b, s)) s--;
  let ea = a.length, eb = b.length;
  while (ea > s && eb > s && a[ea - 1] === b[eb - 1]) { ea--; eb--; }
  if (high(a, ea) || high(b, eb)) { ea++; eb++; }
  return [s, ea, b.slice(s, eb)];
}
// Mine (old -> mine) applied on top of theirs (old -> theirs).
function merge(old, mine, theirs) {
  if (mine === old || mine === theirs) return theirs;
  if (theirs === old) return mine;
  const [ms, me, mi] = splice(old, mine), [ts, te, ti] = splice(old, theirs);
  if (me <= ts) return theirs.slice(0, ms) + mi + theirs.slice(me);
  const d = ti.length - (te - ts);
  if (ms >= te) return theirs.slice(0, ms + d) + mi + theirs.slice(me + d);
  const at = ts + ti.length;
  return theirs.slice(0, at) + mi + theirs.slice(at);
}
// Shows `text`, the caret kept in place around the change.
function show(text) {
  if (area.value === text) return;
  const [s, e, ins] = splice(area.value, text), d = ins.length - (e - s);
  const map = (p) => (p <= s ? p : p >= e ? p + d : s + ins.length);
  const a = map(area.selectionStart), b = map(area.selectionEnd);
  area.value = text;
  if (document.activeElement === area) area.setSelectionRange(a, b);
}
// A committed state from the worker: this tab's change since baseText goes on top of it.
function committed(text, rev) {
  const mine = area.value;
  base = rev;
  const old = baseText;
  baseText = text;
  show(merge(old, mine, text));
}
function flush() {
  clearTimeout(timer);
  if (!ws || ws.readyState !== WebSocket.OPEN || sent !== null) return;
  if (area.value === baseText) return;
  sent = area.value;
  ws.send(JSON.stringify({text: sent, base}));
  say('saving…');
}
function schedule() { clearTimeout(timer); timer = setTimeout(flush, 150); }
area.addEventListener('input', () => {
  say(!ws ? 'offline, reconnecting…' : sent === null ? 'editing…' : 'saving…');
  schedule();
});

function connect() {
  const url = new URL('ws', location.href);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  ws = new WebSocket(url);
  ws.onopen = () => { retryMs = 250; };
  ws.onmessage = (ev) => {
    const m = JSON.parse(ev.data);
    // A greeting names the socket's worker: a new one after a reconnect.
    if ('pid' in m) pid.textContent = m.pid;
    if ('ack' in m) {  // committed: durable in the worker's file
      base = m.ack; baseText = sent; sent = null;
      if (area.value === baseText) say('saved, revision ' + base); else flush();
    } else if ('error' in m) {
      sent = null;
      say('not saved: ' + m.error);
    } else if ('text' in m) {
      // The greeting of a new socket: an edit in flight on the lost one may have been committed
      // (then it is the text, unless another tab edited since: then it is merged once more).
      // A committed edit whose ack was lost with the old socket is saved all the same: say so;
      // as a tab that had said "saved" before the socket went and has nothing new since.
      const mine = 'you' in m && sent !== null && m.text === sent;
      if (mine) baseText = sent;
      if (m.stale || 'you' in m) sent = null;
      committed(m.text, m.rev);
      if (sent === null && area.value === baseText)
        say((mine || wasSaved ? 'saved, revision ' : 'revision ') + base);
      else if (sent === null) flush();
    }
  };
  ws.onclose = () => {
    ws = null;  // `sent` stays: the next socket's greeting tells whether it was committed
    // (A retry that failed leaves the status "offline": what was said before it still holds.)
    const said = status.textContent;
    if (!said.startsWith('offline')) wasSaved = said.startsWith('saved');
    say('offline, reconnecting…');
    setTimeout(connect, retryMs);
    retryMs = Math.min(retryMs * 2, 5000);
  };
}
connect();
)JS";

}  // namespace

int main() {
  auto note = std::make_unique<Note>();
  worker::WorkerOptions options;
  options.redact = [](const std::exception&) {
    return worker::PublicError{"the note's storage failed", "note_storage_failed", ""};
  };
  return worker::worker_main(
      [&](worker::WorkerContext& ctx, http::SiteBuilder& site) {
        Note& n = *note;
        std::string dir = std::string(ctx.state_dir().empty() ? "." : ctx.state_dir()) + "/notes";
        if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST)
          throw std::runtime_error("cannot create " + dir + ": " + std::strerror(errno));
        std::string file_name = file_name_for(ctx.address()) + ".sqlite";
        // The page names the file by its absolute path (the state directory may be relative to
        // corral's working directory: ".corral" by default).
        char real[PATH_MAX];
        std::string path =
            (::realpath(dir.c_str(), real) ? std::string(real) : dir) + "/" + file_name;
        n.file = std::make_unique<NoteFile>(path);
        n.file->load(n.text, n.rev);

        // Every save is committed already: the closer only closes the handle (which folds the
        // WAL back into the file).
        ctx.on_close([&n] { n.file->close(); });

        std::string key(ctx.address().substr(ctx.address().find(':') + 1));
        site.route("GET /", [&n, &ctx, key, path](http::Request& req) {
          return http::Response::html(fmt::format(
              kPage, fmt::arg("title", html_escape("note " + key)),
              fmt::arg("address", html_escape(ctx.address())), fmt::arg("pid", ::getpid()),
              fmt::arg("file", html_escape(path)), fmt::arg("text", html_escape(n.text)),
              fmt::arg("rev", n.rev), fmt::arg("version", CORRAL_VERSION),
              fmt::arg("nonce", req.csp_nonce()), fmt::arg("script", kScript)));
        });
        site.route("GET /favicon.svg", [](http::Request&) {
          auto r = http::Response::bytes(std::string(kFavicon), "image/svg+xml");
          r.header("Cache-Control", "max-age=86400");
          return r;
        });
        site.route("GET /text", [&n](http::Request&) { return http::Response::text(n.text); });
        site.route("GET /rev", [&n](http::Request&) {
          return http::Response::text(std::to_string(n.rev) + "\n");
        });
        site.route("POST /text", [&n](http::Request& req) {
          int64_t rev = n.save(req.body);  // committed (fsynced) before the answer
          n.broadcast(0, nullptr);
          return http::Response::text(std::to_string(rev) + "\n");
        });

        // The front checked the browser's Origin before it relayed the upgrade; the handshake here
        // checks it again against the client's own Host and scheme, which the worker library
        // takes from the proxy's Corral-Host and Corral-Scheme (ServerOptions::behind_corral).
        ws::SocketRoute live;
        // An edit carries the whole text: as large as a POST /text body may be (the parser's 8 MiB
        // max_body), and room for a few whole states queued to a slow tab before it is dropped.
        live.limits = [](const http::Request&) {
          ws::SocketLimits l;
          l.max_message = 8 * 1024 * 1024 + 64 * 1024;  // and the JSON around the text
          l.max_buffered = 32 * 1024 * 1024;
          return l;
        };
        live.on_open = [&n, &ctx](ws::Socket& s) {
          uint64_t id = n.next_tab++;
          n.tabs.emplace(&s, id);
          s.on_message = [&n, &ctx](ws::Socket& s, std::string_view data, bool binary) {
            n.on_message(s, data, binary, ctx.log());
          };
          s.on_close = [&n](ws::Socket& s, uint16_t, std::string_view) { n.tabs.erase(&s); };
          s.send_text(
              to_message({{"text", n.text}, {"rev", n.rev}, {"you", id}, {"pid", ::getpid()}}));
        };
        ws::add_socket_route(site, "/ws", std::move(live));
      },
      std::move(options));
}
