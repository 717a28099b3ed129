// backend.hpp: the Backend (kernels/backend.hpp) of a CUDA device, over the ops of ops.hpp.
#pragma once

#include "kernels/backend.hpp"

namespace dist::kernels::cuda {

/// The backend of device `index`, made on first use (process-wide). Every call makes the
/// device current on the calling thread first, so ranks on different devices may share
/// threads. Throws std::invalid_argument for a device that does not exist.
Backend& backend(int index);

} // namespace dist::kernels::cuda
