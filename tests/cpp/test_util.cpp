#include "test_util.hpp"

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>
#include <stdexcept>

namespace sapiens_seg::test {

std::string fixtures_dir() {
  const char* d = std::getenv("SAPIENS_SEG_FIXTURES");
  if (d == nullptr || *d == '\0') {
    throw std::runtime_error("SAPIENS_SEG_FIXTURES is not set: run the tests through ctest");
  }
  return d;
}

std::string fixture(const std::string& relative) {
  return fixtures_dir() + "/" + relative;
}

std::int64_t Array::numel() const {
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  return n;
}

Array read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  const std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (all.size() < 12 || all.compare(0, 6, "\x93NUMPY") != 0) {
    throw std::runtime_error(path + ": not an .npy file");
  }
  std::size_t hlen = 0, start = 0;
  if (all[6] == 1) {
    hlen = static_cast<unsigned char>(all[8]) | (static_cast<unsigned char>(all[9]) << 8);
    start = 10;
  } else {
    for (int i = 3; i >= 0; --i) hlen = (hlen << 8) | static_cast<unsigned char>(all[8 + i]);
    start = 12;
  }
  const std::string h = all.substr(start, hlen);
  Array a;
  const auto d = h.find("'descr': '") + 10;
  a.dtype = h.substr(d, h.find('\'', d) - d);
  if (h.find("'fortran_order': False") == std::string::npos) {
    throw std::runtime_error(path + ": Fortran order is not supported");
  }
  const auto s = h.find("'shape': (") + 10;
  std::stringstream ss(h.substr(s, h.find(')', s) - s));
  for (std::string tok; std::getline(ss, tok, ',');) {
    if (tok.find_first_not_of(' ') != std::string::npos) a.shape.push_back(std::stoll(tok));
  }
  a.bytes.assign(all.begin() + static_cast<std::ptrdiff_t>(start + hlen), all.end());
  return a;
}

}  // namespace sapiens_seg::test
