#include "serve/assets.hpp"

// Generated at build time from docs/openapi.json and src/serve/page.html (serve.cmake).
#include "serve/openapi_json.hpp"
#include "serve/page_html.hpp"

namespace sapiens_seg::serve {

std::string_view openapi_json() {
  return {reinterpret_cast<const char*>(kOpenapiJson), sizeof kOpenapiJson};
}

std::string_view page_html() {
  return {reinterpret_cast<const char*>(kPageHtml), sizeof kPageHtml};
}

}  // namespace sapiens_seg::serve
