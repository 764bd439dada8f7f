#include "http/response.h"

#include <nlohmann/json.hpp>

#include "http/request.h"

namespace corral::http {

Response Response::text(std::string body, int status) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  r.content_type_ = "text/plain; charset=utf-8";
  return r;
}

Response Response::html(std::string body, int status) {
  Response r;
  r.status = status;
  r.body = std::move(body);
  r.content_type_ = "text/html; charset=utf-8";
  return r;
}

Response Response::json(const nlohmann::json& value, int status) {
  Response r;
  r.status = status;
  // Never throws on a string that is not valid UTF-8 (U+FFFD instead): a response is built on the
  // request path. Addresses reach JSON in their wire form (core/escape.h), which is lossless.
  r.body = value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  r.content_type_ = "application/json";
  return r;
}

Response Response::bytes(std::string data, std::string_view content_type, int status) {
  Response r;
  r.status = status;
  r.body = std::move(data);
  r.set_content_type(std::string(content_type));
  return r;
}

Response Response::redirect(std::string location, int status) {
  Response r;
  r.status = status;
  r.headers.emplace_back("Location", std::move(location));
  return r;
}

Response Response::status_only(int status) {
  Response r;
  r.status = status;
  if (status >= 400) {
    r.body = std::string(reason_line(status));
    r.content_type_ = "text/plain; charset=utf-8";
  }
  return r;
}

Response Response::file(FileSpec spec) {
  Response r;
  r.body = std::move(spec);
  return r;
}

Response Response::stream(std::unique_ptr<StreamProducer> producer, std::string_view content_type,
                          std::optional<uint64_t> length) {
  Response r;
  r.body = StreamBody{std::move(producer), length};
  r.set_content_type(std::string(content_type));
  return r;
}

Response Response::deferred(std::unique_ptr<DeferredProducer> producer) {
  Response r;
  r.body = DeferredBody{std::move(producer)};
  return r;
}

Response Response::upgrade(std::unique_ptr<UpgradeHandler> handler) {
  Response r;
  r.status = 101;
  r.body = UpgradeBody{std::move(handler)};
  return r;
}

std::optional<std::string_view> Response::find_header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (iequals(k, name)) return std::string_view(v);
  return std::nullopt;
}

bool Response::is_html() const {
  auto ct = content_type();
  return ct.size() >= 9 && iequals(ct.substr(0, 9), "text/html");
}

std::string_view reason_line(int status) {
  switch (status) {
    case 100:
      return "Continue\n";
    case 101:
      return "Switching Protocols\n";
    case 200:
      return "OK\n";
    case 201:
      return "Created\n";
    case 202:
      return "Accepted\n";
    case 204:
      return "No Content\n";
    case 206:
      return "Partial Content\n";
    case 301:
      return "Moved Permanently\n";
    case 302:
      return "Found\n";
    case 303:
      return "See Other\n";
    case 304:
      return "Not Modified\n";
    case 307:
      return "Temporary Redirect\n";
    case 308:
      return "Permanent Redirect\n";
    case 400:
      return "Bad Request\n";
    case 401:
      return "Unauthorized\n";
    case 403:
      return "Forbidden\n";
    case 404:
      return "Not Found\n";
    case 405:
      return "Method Not Allowed\n";
    case 408:
      return "Request Timeout\n";
    case 409:
      return "Conflict\n";
    case 411:
      return "Length Required\n";
    case 412:
      return "Precondition Failed\n";
    case 413:
      return "Content Too Large\n";
    case 414:
      return "URI Too Long\n";
    case 415:
      return "Unsupported Media Type\n";
    case 416:
      return "Range Not Satisfiable\n";
    case 417:
      return "Expectation Failed\n";
    case 426:
      return "Upgrade Required\n";
    case 429:
      return "Too Many Requests\n";
    case 431:
      return "Request Header Fields Too Large\n";
    case 500:
      return "Internal Server Error\n";
    case 501:
      return "Not Implemented\n";
    case 502:
      return "Bad Gateway\n";
    case 503:
      return "Service Unavailable\n";
    case 504:
      return "Gateway Timeout\n";
    case 505:
      return "HTTP Version Not Supported\n";
    default:
      return "Unknown\n";
  }
}

std::string_view reason_phrase(int status) {
  std::string_view line = reason_line(status);
  return line.substr(0, line.size() - 1);
}

}  // namespace corral::http
