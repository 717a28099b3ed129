// placement.cpp: which process runs each rank, and which device each rank of this process takes.
#include "actors/runtime/job.hpp"

#include "kernels/devices.hpp"

#include <set>
#include <stdexcept>

namespace dist::runtime {

std::vector<int32_t> process_of_ranks(int32_t ranks, int32_t processes) {
    std::vector<int32_t> out(static_cast<size_t>(ranks));
    for (int32_t r = 0; r < ranks; ++r)
        out[static_cast<size_t>(r)] = plan::process_of_rank(r, ranks, processes);
    return out;
}

std::vector<kernels::Device> place_ranks(const Program& program, const plan::Graph& graph,
                                         const std::vector<int32_t>& process_of, int32_t process,
                                         int32_t local_process) {
    std::vector<kernels::Device> out(graph.ranks.size());
    if (program.mesh.profile.cpu()) return out;
    const int gpus = kernels::gpu_count();
    if (gpus == 0)
        throw std::runtime_error("the mesh is " + std::to_string(program.mesh.devices) + " " +
                                 program.mesh.profile.name + " device(s), but " +
                                 (kernels::built_with_cuda()
                                      ? std::string("this machine has no GPU that CUDA can use")
                                      : std::string("this build has no CUDA support")) +
                                 "; a mesh of `cpu` devices trains on this machine's cores");
    // This host's processes are the `local_process` before this one and those after it: the
    // ranks of the ones before take the first GPUs (process sizes may differ by one).
    int64_t next = 0;
    for (int32_t q : process_of)
        if (q >= process - local_process && q < process) ++next;
    for (size_t r = 0; r < out.size(); ++r)
        if (process_of.at(r) == process)
            out[r] = {kernels::Device::Kind::cuda, static_cast<int>(next++ % gpus)};
    return out;
}

std::vector<kernels::Device> place_in_one_process(const Program& program,
                                                  const plan::Graph& graph) {
    return place_ranks(program, graph,
                       process_of_ranks(static_cast<int32_t>(graph.ranks.size()), 1), 0, 0);
}

int32_t gpus_in_use(const std::vector<kernels::Device>& placed) {
    std::set<int> gpus;
    for (const kernels::Device& d : placed)
        if (d.kind == kernels::Device::Kind::cuda) gpus.insert(d.index);
    return static_cast<int32_t>(gpus.size());
}

} // namespace dist::runtime
