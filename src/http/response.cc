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
    r.body = std::string(reason_phrase(status)) + "\n";
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

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 101:
      return "Switching Protocols";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 206:
      return "Partial Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 303:
      return "See Other";
    case 304:
      return "Not Modified";
    case 307:
      return "Temporary Redirect";
    case 308:
      return "Permanent Redirect";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 412:
      return "Precondition Failed";
    case 413:
      return "Content Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 416:
      return "Range Not Satisfiable";
    case 417:
      return "Expectation Failed";
    case 426:
      return "Upgrade Required";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return "Unknown";
  }
}

}  // namespace corral::http
