// Files served as they are, compiled into the binary so that the server reads no file at run
// time: the OpenAPI document (docs/openapi.json, byte for byte) and the web page at /.
#pragma once

#include <string_view>

namespace sapiens_seg::serve {

std::string_view openapi_json();
std::string_view page_html();

}  // namespace sapiens_seg::serve
