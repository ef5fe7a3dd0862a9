#include "build.hpp"

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core {

Built build(Family family, const MappedFile& file, const std::string& path,
            const BuildRequest& request) {
  switch (family) {
    case Family::kSapiensV1:
      return v1::build(file, path, request);
    case Family::kSapiens2:
      return v2::build(file, path, request);
  }
  throw Error(ErrorCode::kInternal, "no build function for the family of " + path);
}

std::unique_ptr<Runner> pick_runner(Mode mode, const c10::Device& device,
                                    const RunnerFactory& portable, const RunnerFactory& original,
                                    const RunnerFactory& kernels) {
  switch (mode) {
    case Mode::kOriginal:
      return original();
    case Mode::kKernels: {
      const std::string why = kernels_unavailable_reason(device);
      if (!why.empty()) {
        throw Error(ErrorCode::kBackendUnavailable, "kernels mode unavailable: " + why);
      }
      return kernels();
    }
    case Mode::kAuto:
    case Mode::kPortable:
      break;
  }
  return portable();
}

}  // namespace sapiens_seg::core
