// A segment request as the client sent it: the query, then the body by its Content-Type (raw
// image bytes, multipart/form-data with an `image` part, or JSON with base64), checked into
// SegmentRequest or refused with the HTTP status and library error code the contract gives
// (docs/serve.md). Pure functions of the request's text: no I/O, no model.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::serve {

// A refusal: the HTTP status, the library's error code for the JSON body, and the reason the
// metrics count it under (empty: not a rejection the metrics count, e.g. a bad query value).
class HttpError : public std::runtime_error {
 public:
  HttpError(int status, ErrorCode code, const std::string& message, std::string reason = {})
      : std::runtime_error(message), status(status), code(code), reason(std::move(reason)) {}
  int status;
  ErrorCode code;
  std::string reason;
};

enum class Output { kPng, kJson, kNpy, kOverlay };

struct SegmentRequest {
  std::string model;  // "" = the default (first) model
  Output output = Output::kPng;
  std::vector<std::string> classes;  // names or indices; empty = every class
  bool rle = false;
  float opacity = 0.5f;
  std::string image;  // the encoded image's bytes
};

// The query string's parameters, percent-decoded ('+' is a space); a repeated name keeps the
// last value. HttpError 400 for a malformed escape.
std::map<std::string, std::string> parse_query(std::string_view query);

// Applies model, output, classes, rle and opacity from the query (other names are ignored).
void apply_query(const std::map<std::string, std::string>& query, SegmentRequest& request);

// Fills request.image from the body (and, for JSON, the fields that override the query).
// HttpError 415 for another Content-Type, 400 for malformed JSON, base64 or multipart.
void read_body(std::string_view content_type, std::string body, SegmentRequest& request);

// Standard base64 (RFC 4648 alphabet; padding optional, whitespace ignored); nullopt if
// malformed.
std::optional<std::string> base64_decode(std::string_view text);

// The image format named by the leading bytes ("JPEG", "PNG", ...), "" when none the library
// decodes: such a body is refused with 415 before any header is parsed.
std::string sniff_format(std::string_view bytes);

std::string_view to_string(Output o);

}  // namespace sapiens_seg::serve
