// devices.hpp: the devices this build and this machine can run a model on, and their backends.
//
// The one place outside kernels/cuda that knows whether the build has CUDA: code that picks a
// device for a rank asks here, and never names a CUDA type.
#pragma once

#include "kernels/backend.hpp"

namespace dist::kernels {

/// Whether this build has the CUDA ops (nvcc was found).
bool built_with_cuda();
/// GPUs this process can use: 0 in a build without CUDA, or without a driver or a GPU.
int gpu_count();
/// The backend of `device`. Throws std::invalid_argument for a GPU this build or this machine
/// does not have, with what is missing.
Backend& backend_for(Device device);

/// Makes backend_for(device) return `backend` (null: undoes it): for tests that run the
/// device paths of the runtime on a stand-in device.
void set_backend_for(Device device, Backend* backend);

} // namespace dist::kernels
