#include "http/router.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "http/percent.h"

namespace corral::http {

namespace {

enum class SegmentKind : uint8_t { kLiteral, kParam, kWildcard };

struct ParsedSegment {
  SegmentKind kind = SegmentKind::kLiteral;
  std::string literal;    // decoded; kLiteral only
  std::string_view name;  // kParam only; a view into the pattern
};

struct ParsedPattern {
  bool any_method = true;
  Method method = Method::kOther;
  std::string_view method_name;  // a view into the pattern; empty when any_method
  std::vector<ParsedSegment> segments;
};

std::string quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  out += s;
  out += '"';
  return out;
}

bool is_method_token(std::string_view m) {
  if (m.empty() || m[0] < 'A' || m[0] > 'Z') return false;
  for (char c : m)
    if (!((c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-')) return false;
  return true;
}

bool is_identifier(std::string_view s) {
  if (s.empty()) return false;
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  if (!alpha(s[0])) return false;
  for (char c : s)
    if (!alpha(c) && !(c >= '0' && c <= '9')) return false;
  return true;
}

std::string describe_byte(char c) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  unsigned char u = static_cast<unsigned char>(c);
  if (u > 0x20 && u < 0x7f) return std::string("'") + c + "'";
  return std::string("byte 0x") + kHex[u >> 4] + kHex[u & 15];
}

// One line of `problems`, naming the pattern.
void add_problem(std::vector<std::string>& problems, std::string_view pattern, std::string what) {
  problems.push_back("route " + quoted(pattern) + ": " + std::move(what));
}

// Parses segment number `index` of `pattern` (`last` when nothing follows it) into `ps`;
// `before` holds the segments parsed so far. Problems go to `problems`.
void parse_segment(std::string_view pattern, std::string_view seg, bool last, size_t index,
                   const std::vector<ParsedSegment>& before, ParsedSegment& ps,
                   std::vector<std::string>& problems) {
  auto problem = [&](std::string what) { add_problem(problems, pattern, std::move(what)); };
  std::string where = "segment " + std::to_string(index) + " " + quoted(seg);
  if (seg.empty()) {
    // Only a trailing slash ("/", "/a/") may leave an empty segment: a request segment is never
    // matched as empty elsewhere, so "/a//b" could never match.
    if (!last) problem("empty " + where + " (\"//\"): only a trailing '/' is allowed");
  } else if (seg == "*") {
    ps.kind = SegmentKind::kWildcard;
    if (!last) problem("'*' must be the last segment, found as " + where);
  } else if (seg.front() == '{' || seg.back() == '}') {
    if (seg.size() < 2 || seg.front() != '{' || seg.back() != '}' ||
        seg.find_first_of("{}", 1) != seg.size() - 1) {
      problem("a parameter must be a whole segment \"{name}\", found " + where);
    } else {
      ps.kind = SegmentKind::kParam;
      ps.name = seg.substr(1, seg.size() - 2);
      if (!is_identifier(ps.name)) {
        problem("parameter name " + quoted(ps.name) +
                " is not an identifier (letters, digits, '_'; not starting with a digit)");
      }
      for (const auto& other : before) {
        if (other.kind == SegmentKind::kParam && other.name == ps.name) {
          problem("parameter name " + quoted(ps.name) + " is used twice");
          break;
        }
      }
    }
  } else {
    bool ok = true;
    for (char c : seg) {
      if (c == '{' || c == '}' || c == '*') {
        problem(std::string("'") + c + "' in " + where +
                ": '{name}' and '*' must be whole segments");
        ok = false;
        break;
      }
      if (c != '%' && !is_valid_path_char(c)) {
        problem(describe_byte(c) + " is not allowed in a path literal (" + where +
                "); percent-encode it");
        ok = false;
        break;
      }
    }
    if (ok && !percent_decode_segment(seg, ps.literal)) {
      problem("bad percent-escape in " + where +
              " (want %XX with two hex digits, not %00 nor %2F)");
    }
  }
}

// Parses `pattern` into `out`. Every syntax problem is appended to `problems` as one line naming
// the pattern; returns whether there was none.
bool parse_pattern(std::string_view pattern, ParsedPattern& out,
                   std::vector<std::string>& problems) {
  const size_t problems_before = problems.size();
  auto problem = [&](std::string what) { add_problem(problems, pattern, std::move(what)); };

  std::string_view path = pattern;
  out = ParsedPattern{};
  if (pattern.empty()) {
    problem("empty pattern (want \"[METHOD ]/path\")");
    return false;
  }
  if (pattern[0] != '/') {
    size_t sp = pattern.find(' ');
    if (sp == std::string_view::npos) {
      problem("the path must start with '/'");
      return false;
    }
    std::string_view method = pattern.substr(0, sp);
    path = pattern.substr(sp + 1);
    if (!is_method_token(method)) {
      problem("method " + quoted(method) + " must be an uppercase token such as GET");
    } else {
      out.any_method = false;
      out.method = parse_method(method);
      out.method_name = method;
    }
    if (path.empty() || path[0] != '/') {
      problem("the path must start with '/' (one space after the method)");
      return false;
    }
  }

  // path = "/" seg ("/" seg)*; "/" alone is one empty segment.
  std::string_view rest = path.substr(1);
  size_t index = 0;
  for (;;) {
    size_t slash = rest.find('/');
    std::string_view seg = rest.substr(0, slash);
    const bool last = slash == std::string_view::npos;
    ++index;
    ParsedSegment ps;
    parse_segment(pattern, seg, last, index, out.segments, ps, problems);
    out.segments.push_back(std::move(ps));
    if (last) break;
    rest = rest.substr(slash + 1);
  }
  return problems.size() == problems_before;
}

// Compares the decoding of a raw request segment (already checked by percent_path_decodable)
// with a decoded literal, bytes as unsigned. Decodes on the fly: nothing is allocated.
int compare_decoded(std::string_view raw, std::string_view literal) {
  size_t i = 0, j = 0;
  while (i < raw.size() && j < literal.size()) {
    unsigned char c;
    if (raw[i] == '%' && i + 2 < raw.size()) {
      c = static_cast<unsigned char>(hex_digit_value(raw[i + 1]) * 16 +
                                     hex_digit_value(raw[i + 2]));
      i += 3;
    } else {
      c = static_cast<unsigned char>(raw[i++]);
    }
    unsigned char d = static_cast<unsigned char>(literal[j++]);
    if (c != d) return c < d ? -1 : 1;
  }
  const bool raw_done = i == raw.size(), literal_done = j == literal.size();
  if (raw_done && literal_done) return 0;
  return raw_done ? -1 : 1;
}

bool less_unsigned(std::string_view a, std::string_view b) {
  const size_t n = std::min(a.size(), b.size());
  int c = n == 0 ? 0 : std::memcmp(a.data(), b.data(), n);  // memcmp compares as unsigned char
  return c != 0 ? c < 0 : a.size() < b.size();
}

bool same_method(Method a, std::string_view a_name, Method b, std::string_view b_name) {
  return a == b && (a != Method::kOther || a_name == b_name);
}

// The segment of `path` starting after the '/' at `pos`, and where it ends.
std::string_view segment_at(std::string_view path, size_t pos, size_t& end) {
  size_t start = pos + 1;
  end = path.find('/', start);
  if (end == std::string_view::npos) end = path.size();
  return path.substr(start, end - start);
}

bool valid_request_path(std::string_view raw_path) {
  return !raw_path.empty() && raw_path[0] == '/' && percent_path_decodable(raw_path);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Router

struct Router::Impl {
  struct Entry {
    Method method;
    std::string_view method_name;  // a view into text
    uint32_t route;
  };
  // The routes ending at one place of the trie (a path, or a wildcard at a prefix).
  struct Endpoints {
    std::vector<Entry> specific;
    int32_t any = -1;
    bool empty() const { return specific.empty() && any < 0; }
  };
  struct Node {
    std::vector<std::pair<std::string, uint32_t>> literals;  // decoded text -> node, sorted
    int32_t param_child = -1;
    Endpoints terminal;  // routes whose path ends here
    Endpoints wildcard;  // routes whose path is this prefix followed by '*'
  };
  struct Route {
    std::string_view pattern;  // a view into text
    size_t id;
    std::vector<std::string_view> param_names;  // views into text, in path order
  };

  std::unique_ptr<char[]> text;  // every pattern, back to back: stable across moves
  std::vector<Route> routes;
  std::vector<Node> nodes;  // nodes[0] is the root (the empty prefix)

  // Build steps. insert_path adds `parsed`'s path to the trie (its parameter names to `route`)
  // and returns the endpoints its routes end at; claim records route `index` there for parsed's
  // method, or adds a problem and returns false when another route holds that place already.
  Endpoints& insert_path(const ParsedPattern& parsed, Route& route);
  bool claim(Endpoints& endpoints, const ParsedPattern& parsed, std::string_view pattern,
             uint32_t index, std::vector<std::string>& problems);

  // One depth-first walk over the trie, in precedence order. In the find pass it stops at the
  // first route answering the method; in the allow pass (after a failed find that matched a path)
  // it visits every matching route and collects its methods.
  struct Walk {
    const Impl& impl;
    Method method;
    std::string_view method_name;
    std::string_view path;
    Request& req;
    bool collect_allow = false;
    bool path_matched = false;
    int32_t found = -1;
    std::vector<std::string_view> allow;
  };

  static int32_t pick(const Endpoints& e, Method m, std::string_view name) {
    for (const auto& x : e.specific)
      if (same_method(x.method, x.method_name, m, name)) return static_cast<int32_t>(x.route);
    if (m == Method::kHead) {
      for (const auto& x : e.specific)
        if (x.method == Method::kGet) return static_cast<int32_t>(x.route);
    }
    return e.any;
  }

  bool visit(Walk& w, const Endpoints& e, size_t pos, bool is_wildcard) const {
    if (e.empty()) return false;
    if (w.collect_allow) {
      for (const auto& x : e.specific) w.allow.push_back(x.method_name);
      return false;
    }
    int32_t r = pick(e, w.method, w.method_name);
    if (r < 0) {
      w.path_matched = true;
      return false;
    }
    w.found = r;
    if (is_wildcard) {
      if (pos == w.path.size()) {
        w.req.wildcard.clear();
      } else {
        percent_decode_path(w.path.substr(pos + 1), w.req.wildcard);  // checked before the walk
      }
    }
    return true;
  }

  bool walk(Walk& w, uint32_t node_index, size_t pos) const {
    const Node& n = nodes[node_index];
    if (pos == w.path.size()) {
      return visit(w, n.terminal, pos, false) || visit(w, n.wildcard, pos, true);
    }
    size_t end;
    std::string_view seg = segment_at(w.path, pos, end);
    auto it =
        std::lower_bound(n.literals.begin(), n.literals.end(), seg,
                         [](const std::pair<std::string, uint32_t>& edge, std::string_view s) {
                           return compare_decoded(s, edge.first) > 0;
                         });
    if (it != n.literals.end() && compare_decoded(seg, it->first) == 0) {
      if (walk(w, it->second, end)) return true;
    }
    if (n.param_child >= 0 && !seg.empty()) {
      if (!w.collect_allow) {
        w.req.params.emplace_back();
        percent_decode_segment(seg, w.req.params.back().value);  // checked before the walk
      }
      if (walk(w, static_cast<uint32_t>(n.param_child), end)) return true;
      if (!w.collect_allow) w.req.params.pop_back();
    }
    return visit(w, n.wildcard, pos, true);
  }
};

Router::Router(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Router::Router(Router&&) noexcept = default;
Router& Router::operator=(Router&&) noexcept = default;
Router::~Router() = default;

size_t Router::size() const {
  return impl_->routes.size();
}

namespace {

// Why a route for this method is refused; empty when it is not.
std::string_view refused_method_reason(Method method) {
  switch (method) {
    case Method::kTrace:
    case Method::kTrack:
      return "it echoes the request, headers and cookies included (cross-site tracing)";
    case Method::kConnect:
      return "corral is not a forward proxy";
    default:
      return {};
  }
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string out;
  for (const auto& line : lines) {
    if (!out.empty()) out += '\n';
    out += line;
  }
  return out;
}

}  // namespace

Router::Impl::Endpoints& Router::Impl::insert_path(const ParsedPattern& parsed, Route& route) {
  uint32_t node = 0;
  for (const auto& seg : parsed.segments) {
    if (seg.kind == SegmentKind::kWildcard) return nodes[node].wildcard;
    uint32_t next;
    if (seg.kind == SegmentKind::kParam) {
      route.param_names.push_back(seg.name);
      if (nodes[node].param_child < 0) {
        next = static_cast<uint32_t>(nodes.size());
        nodes[node].param_child = static_cast<int32_t>(next);
        nodes.emplace_back();  // invalidates references into nodes: indices only above
      } else {
        next = static_cast<uint32_t>(nodes[node].param_child);
      }
    } else {
      auto& lits = nodes[node].literals;
      auto it = std::find_if(lits.begin(), lits.end(),
                             [&](const auto& edge) { return edge.first == seg.literal; });
      if (it != lits.end()) {
        next = it->second;
      } else {
        next = static_cast<uint32_t>(nodes.size());
        lits.emplace_back(seg.literal, next);
        nodes.emplace_back();
      }
    }
    node = next;
  }
  return nodes[node].terminal;
}

bool Router::Impl::claim(Endpoints& endpoints, const ParsedPattern& parsed,
                         std::string_view pattern, uint32_t index,
                         std::vector<std::string>& problems) {
  if (parsed.any_method) {
    if (endpoints.any >= 0) {
      problems.push_back("routes " + quoted(routes[endpoints.any].pattern) + " and " +
                         quoted(pattern) + " conflict: same path shape, both for any method");
      return false;
    }
    endpoints.any = static_cast<int32_t>(index);
    return true;
  }
  auto it = std::find_if(endpoints.specific.begin(), endpoints.specific.end(), [&](const Entry& e) {
    return same_method(e.method, e.method_name, parsed.method, parsed.method_name);
  });
  if (it != endpoints.specific.end()) {
    problems.push_back("routes " + quoted(routes[it->route].pattern) + " and " + quoted(pattern) +
                       " conflict: same method and path shape");
    return false;
  }
  endpoints.specific.push_back({parsed.method, parsed.method_name, index});
  return true;
}

core::Result<Router> Router::build(std::vector<RouteDef> defs) {
  auto impl = std::make_unique<Impl>();
  size_t total = 0;
  for (const auto& d : defs) total += d.pattern.size();
  impl->text = std::make_unique<char[]>(total + 1);
  impl->nodes.emplace_back();

  std::vector<std::string> problems;
  size_t offset = 0;
  for (const auto& d : defs) {
    std::memcpy(impl->text.get() + offset, d.pattern.data(), d.pattern.size());
    std::string_view pattern(impl->text.get() + offset, d.pattern.size());
    offset += d.pattern.size();

    ParsedPattern parsed;
    if (!parse_pattern(pattern, parsed, problems)) continue;
    if (!parsed.any_method) {
      std::string_view why = refused_method_reason(parsed.method);
      if (!why.empty()) {
        problems.push_back(std::string(parsed.method_name) + " routes are refused: " +
                           quoted(pattern) + " (" + std::string(why) + ")");
        continue;
      }
    }

    Impl::Route route{pattern, d.id, {}};
    Impl::Endpoints& endpoints = impl->insert_path(parsed, route);
    const uint32_t index = static_cast<uint32_t>(impl->routes.size());
    if (!impl->claim(endpoints, parsed, pattern, index, problems)) continue;
    impl->routes.push_back(std::move(route));
  }

  if (!problems.empty()) return core::Error{EINVAL, join_lines(problems)};
  for (auto& n : impl->nodes) {
    std::sort(n.literals.begin(), n.literals.end(),
              [](const auto& a, const auto& b) { return less_unsigned(a.first, b.first); });
  }
  return Router(std::move(impl));
}

Router::Match Router::match(Method method, std::string_view method_name, std::string_view raw_path,
                            Request& req) const {
  Match m;
  req.params.clear();
  req.wildcard.clear();
  req.pattern = {};
  if (!valid_request_path(raw_path)) {
    m.kind = MatchKind::kBadPath;
    return m;
  }
  Impl::Walk w{*impl_, method, method_name, raw_path, req, false, false, -1, {}};
  if (impl_->walk(w, 0, 0)) {
    const Impl::Route& route = impl_->routes[static_cast<size_t>(w.found)];
    for (size_t i = 0; i < req.params.size(); ++i) req.params[i].name = route.param_names[i];
    m.kind = MatchKind::kFound;
    m.id = route.id;
    m.pattern = route.pattern;
    req.pattern = route.pattern;
    return m;
  }
  req.params.clear();
  req.wildcard.clear();
  if (!w.path_matched) {
    m.kind = MatchKind::kNotFound;
    return m;
  }
  // 405: a second walk collects the methods of every route whose path matches. Only on this
  // (rare, client-error) path does match() build a string.
  w.collect_allow = true;
  impl_->walk(w, 0, 0);
  auto& allow = w.allow;
  if (std::find(allow.begin(), allow.end(), "GET") != allow.end() &&
      std::find(allow.begin(), allow.end(), "HEAD") == allow.end()) {
    allow.push_back("HEAD");
  }
  std::sort(allow.begin(), allow.end());
  allow.erase(std::unique(allow.begin(), allow.end()), allow.end());
  for (auto name : allow) {
    if (!m.allow.empty()) m.allow += ", ";
    m.allow += name;
  }
  m.kind = MatchKind::kMethodNotAllowed;
  return m;
}

// ---------------------------------------------------------------------------------------------
// PathPattern

core::Result<PathPattern> PathPattern::parse(std::string_view pattern) {
  ParsedPattern parsed;
  std::vector<std::string> problems;
  if (!parse_pattern(pattern, parsed, problems)) {
    std::string reason;
    for (const auto& p : problems) {
      if (!reason.empty()) reason += '\n';
      reason += p;
    }
    return core::Error{EINVAL, std::move(reason)};
  }
  PathPattern p;
  p.pattern_ = std::string(pattern);
  p.any_method_ = parsed.any_method;
  p.method_ = parsed.method;
  p.method_name_ = std::string(parsed.method_name);
  for (auto& seg : parsed.segments) {
    Kind kind = seg.kind == SegmentKind::kLiteral ? Kind::kLiteral
                : seg.kind == SegmentKind::kParam ? Kind::kParam
                                                  : Kind::kWildcard;
    p.segments_.push_back({kind, std::move(seg.literal)});
  }
  return p;
}

bool PathPattern::matches(Method m, std::string_view name, std::string_view raw_path) const {
  if (!any_method_ && !same_method(method_, method_name_, m, name) &&
      !(m == Method::kHead && method_ == Method::kGet)) {
    return false;
  }
  if (!valid_request_path(raw_path)) return false;
  size_t pos = 0;
  for (const auto& seg : segments_) {
    if (seg.kind == Kind::kWildcard) return true;  // the rest, zero or more segments
    if (pos == raw_path.size()) return false;
    size_t end;
    std::string_view s = segment_at(raw_path, pos, end);
    if (seg.kind == Kind::kParam ? s.empty() : compare_decoded(s, seg.literal) != 0) return false;
    pos = end;
  }
  return pos == raw_path.size();
}

}  // namespace corral::http
