// checkpoint_fuzzer.cpp: libFuzzer over the checkpoint readers (torch.save archives and
// safetensors files), which take files from anywhere. Any input must end in tensors or in an
// error message: no crash, hang, leak or sanitizer report, and what is read is self-consistent.
#include "models/safetensors.hpp"
#include "models/torch_checkpoint.hpp"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>

namespace {

// Every record holds exactly its shape's elements; a failed read leaves nothing behind.
void check(const std::string& error, const dist::models::SafetensorsFile& f) {
    if (!error.empty()) {
        if (!f.tensors.empty()) std::abort();
        return;
    }
    for (const auto& t : f.tensors) {
        uint64_t numel = 1;
        for (int64_t d : t.shape) {
            if (d < 0) std::abort();
            numel *= static_cast<uint64_t>(d);
        }
        if (t.bytes.size() != numel * dist::models::dtype_bytes(t.dtype)) std::abort();
    }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // The readers take a path, as `--load` gives them.
    static const std::string path = [] {
        static std::string p = "/tmp/dist_checkpoint_fuzz_" + std::to_string(::getpid()) + ".bin";
        std::atexit([] { std::remove(p.c_str()); });
        return p;
    }();
    {
        std::ofstream out(path, std::ios::binary | std::ios::trunc);
        out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    }
    dist::models::SafetensorsFile f;
    check(dist::models::read_torch_checkpoint(path, f), f);
    check(dist::models::read_safetensors(path, f), f);
    return 0;
}
