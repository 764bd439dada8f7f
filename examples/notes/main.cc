// corral-notes-worker: one note per address (`note:<id>`), a worker process each, its state in a
// SQLite file per address. `corral serve` with no arguments runs it as the demo on "/note/{id}/*"
// (src/cli/demo.h); any config can declare it as a kind:
//
//   [workers.note]
//   command = ["/path/to/corral-notes-worker"]
//   routes = ["/note/{id}/*"]
//
//   GET  /      an HTML page: the note in a textarea and a save button (inline script and style
//               under the response's CSP nonce)
//   GET  /text  the text (text/plain)
//   POST /text  replaces the text with the request body; answers the new revision
//   GET  /rev   the revision (0 for a note never written)
//
// The file is <state dir>/notes/<address percent-encoded>.sqlite ("note%3Aa.sqlite": a key can
// hold any byte, "/" and ".." included), the directory created 0700. A save is acknowledged
// only once it is durable: one SQLite transaction writes the text and its revision together and
// commits before the answer. The database is in WAL mode with synchronous=FULL: each commit
// fsyncs the WAL, so an acknowledged save survives a kill -9 of the worker and a power cut alike
// (NORMAL would survive only the first). The revision is read from the file in the same
// transaction, so it never goes backwards; a worker that starts reads both back. The memory holds
// a copy of what is committed, for reads. Only one worker runs per address (the address's lock).
#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "core/escape.h"
#include "http/percent.h"
#include "worker/worker.h"

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
    Statement(NoteFile& f, const char* sql) : f_(f) {
      if (sqlite3_prepare_v2(f.db_.get(), sql, -1, &st_, nullptr) != SQLITE_OK) f.fail("prepare");
    }
    ~Statement() { sqlite3_finalize(st_); }
    Statement(const Statement&) = delete;
    Statement& operator=(const Statement&) = delete;
    sqlite3_stmt* get() const { return st_; }

   private:
    NoteFile& f_;
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

// The committed note, and the file it is committed to.
struct Note {
  std::unique_ptr<NoteFile> file;
  std::string text;
  int64_t rev = 0;

  // Throws when the save could not be committed: the route answers 500, the copy is unchanged.
  int64_t save(std::string_view new_text) {
    int64_t r = file->save(new_text);
    text.assign(new_text);
    rev = r;
    return r;
  }
};

constexpr std::string_view kPage = R"(<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style nonce="{nonce}">body{{font:16px/1.5 system-ui,sans-serif;max-width:42rem;margin:3rem auto;padding:0 1rem}}textarea{{width:100%;min-height:14rem;font:inherit}}#status{{color:#666;margin-left:.5em}}code{{background:#eee;padding:0 .2em}}</style>
</head><body>
<h1>{title}</h1>
<p>A note served by its own worker process (address <code>{address}</code>, pid {pid}); each
save is committed to <code>{file}</code> (SQLite, WAL, synchronous=FULL) before it is
acknowledged.</p>
<textarea id="text" spellcheck="false">{text}</textarea>
<p><button id="save">Save</button><span id="status">revision {rev}</span></p>
<script nonce="{nonce}">
const text = document.getElementById('text'), status = document.getElementById('status');
document.getElementById('save').addEventListener('click', async () => {{
  status.textContent = 'saving…';
  try {{
    const r = await fetch('text', {{method: 'POST', body: text.value,
                                    headers: {{'Content-Type': 'text/plain; charset=utf-8'}}}});
    status.textContent = r.ok ? 'saved, revision ' + (await r.text()).trim()
                              : 'not saved: ' + r.status + ' ' + (await r.text()).slice(0, 200);
  }} catch (e) {{
    status.textContent = 'not saved: ' + e;
  }}
}});
</script>
</body></html>
)";

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
        n.file = std::make_unique<NoteFile>(dir + "/" + file_name);
        n.file->load(n.text, n.rev);

        // Every save is committed already: the closer only closes the handle (which folds the
        // WAL back into the file).
        ctx.on_close([&n] { n.file->close(); });

        std::string key(ctx.address().substr(ctx.address().find(':') + 1));
        site.route("GET /", [&n, &ctx, key, file_name](http::Request& req) {
          return http::Response::html(fmt::format(
              kPage, fmt::arg("title", html_escape("note " + key)),
              fmt::arg("address", html_escape(ctx.address())), fmt::arg("pid", ::getpid()),
              fmt::arg("file", html_escape("notes/" + file_name)),
              fmt::arg("text", html_escape(n.text)), fmt::arg("rev", n.rev),
              fmt::arg("nonce", req.csp_nonce())));
        });
        site.route("GET /text", [&n](http::Request&) { return http::Response::text(n.text); });
        site.route("GET /rev", [&n](http::Request&) {
          return http::Response::text(std::to_string(n.rev) + "\n");
        });
        site.route("POST /text", [&n](http::Request& req) {
          int64_t rev = n.save(req.body);  // committed (fsynced) before the answer
          return http::Response::text(std::to_string(rev) + "\n");
        });
      },
      std::move(options));
}
