#include "http/chunked.h"

#include "http/text.h"

#include <cstring>

namespace corral::http {

namespace {}  // namespace

ChunkedDecoder::Result ChunkedDecoder::feed(std::string_view data, core::Buffer& body,
                                            uint64_t max_body, size_t max_trailer_bytes) {
  size_t i = 0;
  const size_t n = data.size();
  while (i < n) {
    const char c = data[i];
    switch (step_) {
      case Step::kSize: {
        if (++line_bytes_ > kMaxSizeLine) return fail(400, "chunk extension too long", i);
        int v = hex_digit_value(c);
        if (v >= 0) {
          if (++digits_ > 16) return fail(400, "chunk size overflow (more than 16 hex digits)", i);
          size_ = (size_ << 4) | static_cast<uint64_t>(v);
          ++i;
          break;
        }
        if (digits_ == 0) return fail(400, "invalid chunk size", i);
        if (c == ';') {
          step_ = Step::kExt;
          semicolon_ = need_name_ = true;
          ++i;
        } else if (c == '\r') {
          step_ = Step::kSizeLf;
          ++i;
        } else if (c == ' ' || c == '\t') {
          step_ = Step::kExt;  // BWS before ';' (RFC 9112 §7.1.1); what follows must be ';'
          ++i;
        } else {
          return fail(400, "invalid chunk size", i);
        }
        break;
      }
      case Step::kExt:
        if (++line_bytes_ > kMaxSizeLine) return fail(400, "chunk extension too long", i);
        // Extensions are ignored; they must not hide control characters or line ends.
        if (in_quote_) {
          if (quote_escape_) {
            quote_escape_ = false;
          } else if (c == '\\') {
            quote_escape_ = true;
          } else if (c == '"') {
            in_quote_ = false;
          } else if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
            return fail(400, "control character in chunk extension", i);
          }
        } else if (c == '"') {
          if (!need_value_) return fail(400, "invalid chunk extension", i);
          need_value_ = false;
          in_quote_ = true;
        } else if (c == ' ' || c == '\t') {
          in_name_ = false;  // BWS ends a name or value
        } else if (c == ';') {
          if (need_name_ || need_value_) return fail(400, "invalid chunk extension", i);
          semicolon_ = need_name_ = true;
          in_name_ = false;
        } else if (c == '\r') {
          if (!semicolon_ || need_name_ || need_value_)
            return fail(400, semicolon_ ? "invalid chunk extension" : "whitespace after chunk size",
                        i);
          step_ = Step::kSizeLf;
        } else if (!semicolon_) {
          return fail(400, "invalid chunk size", i);  // after BWS only ';' may follow the size
        } else if (c == '=') {
          if (need_name_ || need_value_) return fail(400, "invalid chunk extension", i);
          need_value_ = true;
          in_name_ = false;
        } else if (is_tchar(c)) {
          if (!need_name_ && !need_value_ && !in_name_)
            return fail(400, "invalid chunk extension", i);  // "a b": a space inside a name
          need_name_ = need_value_ = false;
          in_name_ = true;
        } else {
          return fail(400, "invalid chunk extension", i);
        }
        ++i;
        break;
      case Step::kSizeLf:
        if (c != '\n') return fail(400, "bare CR after chunk size", i);
        ++i;
        if (size_ == 0) {
          last_ = true;
          step_ = Step::kTrailerLineStart;
        } else {
          if (total_ + size_ > max_body || size_ > max_body)
            return fail(413, "request body too large", i);
          left_ = size_;
          step_ = Step::kData;
        }
        break;
      case Step::kData: {
        size_t take = n - i < left_ ? n - i : static_cast<size_t>(left_);
        body.append(data.substr(i, take));
        total_ += take;
        i += take;
        left_ -= take;
        if (left_ == 0) step_ = Step::kDataCr;
        break;
      }
      case Step::kDataCr:
        if (c != '\r') return fail(400, "chunk data not followed by CRLF", i);
        step_ = Step::kDataLf;
        ++i;
        break;
      case Step::kDataLf:
        if (c != '\n') return fail(400, "chunk data not followed by CRLF", i);
        ++i;
        step_ = Step::kSize;
        size_ = 0;
        digits_ = 0;
        in_quote_ = quote_escape_ = semicolon_ = need_name_ = need_value_ = in_name_ = false;
        line_bytes_ = 0;
        break;
      case Step::kTrailerLineStart:
        if (c == '\r') {
          step_ = Step::kFinalLf;
          ++i;
          break;
        }
        if (c == ' ' || c == '\t') return fail(400, "obs-fold in trailer section", i);
        colon_ = false;
        line_len_ = 0;
        step_ = Step::kTrailerLine;
        break;  // the same byte is checked as part of the line
      case Step::kTrailerLine:
        if (++trailer_bytes_ > max_trailer_bytes) return fail(400, "trailer section too large", i);
        if (c == '\r') {
          if (!colon_) return fail(400, "trailer line without a colon", i);
          step_ = Step::kTrailerLf;
        } else if (c == '\n') {
          return fail(400, "bare LF in trailer section", i);
        } else if ((static_cast<unsigned char>(c) < 0x20 && c != '\t') || c == 0x7f) {
          return fail(400, "control character in trailer section", i);
        } else if (!colon_) {
          if (c == ':') {
            if (line_len_ == 0) return fail(400, "empty trailer field name", i);
            colon_ = true;
          } else if (!is_tchar(c)) {
            return fail(400, "invalid trailer field name", i);
          }
        }
        ++line_len_;
        ++i;
        break;
      case Step::kTrailerLf:
        if (c != '\n') return fail(400, "bare CR in trailer section", i);
        ++i;
        step_ = Step::kTrailerLineStart;
        break;
      case Step::kFinalLf:
        if (c != '\n') return fail(400, "bare CR at the end of the chunked body", i);
        ++i;
        return {State::kDone, i, 0, {}};
    }
  }
  return {State::kNeedMore, n, 0, {}};
}

}  // namespace corral::http
