// devices.cpp: device discovery and backends, with or without CUDA in the build.
#include "kernels/devices.hpp"

#ifdef DIST_HAVE_CUDA
#include "kernels/cuda/backend.hpp"
#include "kernels/cuda/ops.hpp"
#endif

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

namespace dist::kernels {

bool built_with_cuda() {
#ifdef DIST_HAVE_CUDA
    return true;
#else
    return false;
#endif
}

int gpu_count() {
#ifdef DIST_HAVE_CUDA
    return cuda::device_count();
#else
    return 0;
#endif
}

namespace {

std::mutex stand_ins_mutex;
std::map<std::pair<int, int>, Backend*> stand_ins;

} // namespace

void set_backend_for(Device device, Backend* backend) {
    std::lock_guard lock(stand_ins_mutex);
    const std::pair<int, int> key{static_cast<int>(device.kind), device.index};
    if (backend)
        stand_ins[key] = backend;
    else
        stand_ins.erase(key);
}

Backend& backend_for(Device device) {
    {
        std::lock_guard lock(stand_ins_mutex);
        auto it = stand_ins.find({static_cast<int>(device.kind), device.index});
        if (it != stand_ins.end()) return *it->second;
    }
    if (device.kind == Device::Kind::cpu) return cpu_backend();
#ifdef DIST_HAVE_CUDA
    int count = cuda::device_count();
    if (device.index < 0 || device.index >= count)
        throw std::invalid_argument("no GPU " + device.str() + " on this machine (" +
                                    std::to_string(count) + " visible)");
    return cuda::backend(device.index);
#else
    throw std::invalid_argument(device.str() + ": this build has no CUDA support (nvcc was not "
                                               "found when it was configured)");
#endif
}

} // namespace dist::kernels
