// safetensors.hpp: checkpoint files in the Hugging Face safetensors format.
//
// Sits between a model's parameters and the disk: a model turns its weights into named byte
// blobs (TensorRecord) and this module writes or reads them, so GPT-2 and Llama checkpoints can
// be exchanged with Hugging Face tools. The module knows nothing about models or devices; it
// only lays out and validates the file:
//
//   [8-byte little-endian header length N][N bytes of JSON header, space-padded][byte buffer]
//
// The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets
// into the byte buffer) and may hold a "__metadata__" object of string to string. Reading checks
// everything an untrusted file can get wrong before allocating tensor memory, and reports the
// first problem as a message naming the file (and the tensor, where one is at fault).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace dist::models {

/// Element types a checkpoint may hold: every type the safetensors format names ("F64", "F32",
/// "BF16", "F16", "F8_E4M3", "F8_E5M2", "I64" ... "U8", "BOOL"), so that a file with, say, a
/// boolean mask buffer beside its weights is still readable. Weights themselves are F32, BF16,
/// F16 or F64 (see checkpoint.cpp).
enum class TensorDType {
    f32,
    bf16,
    f16,
    i32,
    i64,
    f64,
    f8_e4m3,
    f8_e5m2,
    i16,
    i8,
    u64,
    u32,
    u16,
    u8,
    boolean
};

/// One named tensor as raw little-endian bytes in row-major order. An empty `shape` is a 0-d
/// scalar (one element); a shape with a zero dimension holds no bytes.
struct TensorRecord {
    std::string name;
    TensorDType dtype = TensorDType::f32;
    std::vector<int64_t> shape;
    std::vector<uint8_t> bytes;
};

/// The whole contents of a safetensors file. Tensors are kept in buffer order: the order they
/// were given to write_safetensors, and the order of their data offsets after read_safetensors.
struct SafetensorsFile {
    std::vector<TensorRecord> tensors;
    std::map<std::string, std::string> metadata;

    /// The tensor called `name`, or nullptr.
    const TensorRecord* find(std::string_view name) const;
};

/// Writes `file` to `path` atomically: a temporary file in the same folder, fsync, rename over
/// `path`, fsync of the folder. Tensors are packed contiguously in the order given, and the
/// header is padded with spaces to a multiple of 8 bytes (as Hugging Face does). On any failure
/// the old file is untouched, no temporary is left, and the returned string says why ("" on
/// success). Invalid input (duplicate or reserved names, negative dims, a byte count that is not
/// numel * dtype size, names or metadata that are not UTF-8) is refused before anything is
/// written.
std::string write_safetensors(const std::string& path, const SafetensorsFile& file);

/// Reads and validates the whole file; on failure returns an error message naming the file and
/// what is wrong (and the tensor, where one is at fault); `out` is then left empty. Returns ""
/// on success.
std::string read_safetensors(const std::string& path, SafetensorsFile& out);

/// Bytes per element of `t`.
size_t dtype_bytes(TensorDType t);

/// The file spelling of `t`: "F32", "BF16", "F16", "I32", "I64", "BOOL", ...
const char* to_string(TensorDType t);

} // namespace dist::models
