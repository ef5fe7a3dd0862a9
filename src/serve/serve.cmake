# `sapiens-seg serve` (src/serve/): compiled into the sapiens-seg executable, on Boost.Beast and
# Asio (header-only, Debian's libboost1.81-dev). The OpenAPI document and the web page are
# embedded at build time so that the binary serves them without reading a file.
find_package(Boost 1.81 REQUIRED CONFIG COMPONENTS headers)

set(_serve_gen ${CMAKE_BINARY_DIR}/generated/serve)
set(_serve_assets "")
foreach(_asset "docs/openapi.json;openapi_json;kOpenapiJson" "src/serve/page.html;page_html;kPageHtml")
  list(GET _asset 0 _in)
  list(GET _asset 1 _stem)
  list(GET _asset 2 _symbol)
  add_custom_command(
    OUTPUT ${_serve_gen}/serve/${_stem}.hpp
    COMMAND ${CMAKE_COMMAND} -DIN=${CMAKE_SOURCE_DIR}/${_in} -DOUT=${_serve_gen}/serve/${_stem}.hpp
            -DNAME=${_symbol} -DNAME_OF_INPUT=${_in} -P ${CMAKE_SOURCE_DIR}/src/serve/embed.cmake
    DEPENDS ${CMAKE_SOURCE_DIR}/${_in} ${CMAKE_SOURCE_DIR}/src/serve/embed.cmake
    COMMENT "Embedding ${_in}" VERBATIM)
  list(APPEND _serve_assets ${_serve_gen}/serve/${_stem}.hpp)
endforeach()
file(MAKE_DIRECTORY ${_serve_gen}/serve)

target_sources(sapiens-seg PRIVATE
  src/serve/assets.cpp src/serve/batcher.cpp src/serve/command.cpp src/serve/encode.cpp
  src/serve/metrics.cpp src/serve/request.cpp src/serve/server.cpp ${_serve_assets})
target_include_directories(sapiens-seg PRIVATE ${_serve_gen})
target_link_libraries(sapiens-seg PRIVATE Boost::headers)
# One Asio/Beast implementation per program, and no deprecated interfaces in new code.
target_compile_definitions(sapiens-seg PRIVATE BOOST_ASIO_NO_DEPRECATED BOOST_BEAST_USE_STD_STRING_VIEW)
