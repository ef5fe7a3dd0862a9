#include "build.hpp"

#include "sapiens_seg/error.hpp"

namespace sapiens_seg::core {

namespace {
Built build_family(Family family, const MappedFile& file, const std::string& path,
                   const BuildRequest& request) {
  switch (family) {
    case Family::kSapiensV1:
      return v1::build(file, path, request);
    case Family::kSapiens2:
      return v2::build(file, path, request);
  }
  throw Error(ErrorCode::kInternal, "no build function for the family of " + path);
}
}  // namespace

Built build(Family family, const MappedFile& file, const std::string& path,
            const BuildRequest& request) {
  Built net = build_family(family, file, path, request);
  if (request.card && request.card->num_classes > 0 &&
      net.num_classes != request.card->num_classes) {
    throw Error(ErrorCode::kFormatError,
                path + ": the network has " + std::to_string(net.num_classes) +
                    " classes but its card lists " + std::to_string(request.card->num_classes));
  }
  return net;
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
