// safetensors.cpp: writing and validating safetensors checkpoint files.
//
// Writing builds the header with nlohmann::ordered_json so the bytes match Hugging Face's own
// writer ("__metadata__" first, then tensors in buffer order, fields dtype/shape/data_offsets),
// and replaces the target with POSIX calls so a crash never leaves a half-written checkpoint.
// Reading treats the file as untrusted: every size is checked against the file length before
// anything is allocated, and all JSON exceptions are caught here and turned into messages.
#include "models/safetensors.hpp"

#include "models/atomic_file.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <system_error>

namespace dist::models {

namespace {

using nlohmann::json;
using nlohmann::ordered_json;
namespace fs = std::filesystem;

// Hugging Face refuses headers above 100 MB; so do we, which also bounds the header allocation.
constexpr uint64_t max_header_bytes = 100'000'000;
constexpr const char* metadata_key = "__metadata__";

std::optional<TensorDType> parse_dtype(std::string_view s) {
    for (TensorDType t :
         {TensorDType::f32, TensorDType::bf16, TensorDType::f16, TensorDType::i32, TensorDType::i64,
          TensorDType::f64, TensorDType::f8_e4m3, TensorDType::f8_e5m2, TensorDType::i16,
          TensorDType::i8, TensorDType::u64, TensorDType::u32, TensorDType::u16, TensorDType::u8,
          TensorDType::boolean}) {
        if (s == to_string(t)) return t;
    }
    return std::nullopt;
}

std::string shape_str(const std::vector<int64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

std::string errno_str(int err) {
    return std::generic_category().message(err);
}

// Byte count of a tensor of `shape` and `t`; returns an error message instead if a dimension
// is negative or the count overflows int64.
std::string byte_count(const std::vector<int64_t>& shape, TensorDType t, uint64_t& bytes_out) {
    constexpr int64_t max = std::numeric_limits<int64_t>::max();
    int64_t numel = 1;
    for (int64_t d : shape) {
        if (d < 0)
            return "negative dimension " + std::to_string(d) + " in shape " + shape_str(shape);
        if (d != 0 && numel > max / d)
            return "element count of shape " + shape_str(shape) + " overflows";
        numel *= d;
    }
    const auto size = static_cast<int64_t>(dtype_bytes(t));
    if (size == 0) return "invalid dtype";
    if (numel > max / size) return "byte count of shape " + shape_str(shape) + " overflows";
    bytes_out = static_cast<uint64_t>(numel * size);
    return "";
}

// The header JSON, space-padded to a multiple of 8 bytes, after checking every tensor.
std::string build_header(const SafetensorsFile& file, std::string& header_out) {
    ordered_json header = ordered_json::object();
    if (!file.metadata.empty()) {
        ordered_json meta = ordered_json::object();
        for (const auto& [k, v] : file.metadata) meta[k] = v;
        header[metadata_key] = std::move(meta);
    }
    std::set<std::string_view> names;
    uint64_t offset = 0;
    for (const TensorRecord& t : file.tensors) {
        const std::string where = "tensor '" + t.name + "': ";
        if (t.name == metadata_key) return where + "the name is reserved for metadata";
        if (!names.insert(t.name).second) return where + "duplicate name";
        uint64_t bytes = 0;
        if (auto err = byte_count(t.shape, t.dtype, bytes); !err.empty()) return where + err;
        if (bytes != t.bytes.size()) {
            return where + "holds " + std::to_string(t.bytes.size()) + " bytes but shape " +
                   shape_str(t.shape) + " of " + to_string(t.dtype) + " needs " +
                   std::to_string(bytes);
        }
        ordered_json entry = ordered_json::object();
        entry["dtype"] = to_string(t.dtype);
        entry["shape"] = t.shape;
        entry["data_offsets"] = ordered_json::array({offset, offset + bytes});
        header[t.name] = std::move(entry);
        offset += bytes;
    }
    try {
        header_out = header.dump();
    } catch (const json::exception&) {
        return "a tensor name or metadata entry is not valid UTF-8";
    }
    header_out.append((8 - header_out.size() % 8) % 8, ' ');
    return "";
}

// One header entry after validation, before the layout check.
struct Entry {
    std::string name;
    TensorDType dtype = TensorDType::f32;
    std::vector<int64_t> shape;
    uint64_t begin = 0, end = 0;
};

std::string parse_entry(const std::string& name, const json& value, uint64_t buffer_bytes,
                        Entry& out) {
    const std::string where = "tensor '" + name + "': ";
    if (!value.is_object()) return where + "header entry is not a JSON object";
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
        if (!value.contains(field)) return where + "missing \"" + field + "\"";
    }
    const json& dtype = value["dtype"];
    if (!dtype.is_string()) return where + "\"dtype\" is not a string";
    const auto parsed = parse_dtype(dtype.get_ref<const std::string&>());
    if (!parsed) {
        return where + "unknown dtype '" + dtype.get<std::string>() +
               "' (expected one of the safetensors types: F64, F32, BF16, F16, F8_E4M3, F8_E5M2, "
               "I64, "
               "I32, I16, I8, U64, U32, U16, U8 or BOOL)";
    }
    const json& shape = value["shape"];
    if (!shape.is_array()) return where + "\"shape\" is not an array of integers";
    std::vector<int64_t> dims;
    for (const json& d : shape) {
        if (!d.is_number_integer()) return where + "\"shape\" is not an array of integers";
        if (d.is_number_unsigned() &&
            d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
            return where + "dimension " + d.dump() + " in \"shape\" is too large";
        }
        dims.push_back(d.get<int64_t>());
    }
    uint64_t bytes = 0;
    if (auto err = byte_count(dims, *parsed, bytes); !err.empty()) return where + err;
    const json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
        return where + "\"data_offsets\" is not an array of two non-negative integers";
    }
    const auto begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    const std::string range = "data_offsets " + offsets.dump();
    if (begin > end) return where + range + " has begin after end";
    if (end > buffer_bytes) {
        return where + range + " lie outside the " + std::to_string(buffer_bytes) + "-byte buffer";
    }
    if (end - begin != bytes) {
        return where + range + " hold " + std::to_string(end - begin) + " bytes but shape " +
               shape_str(dims) + " of " + to_string(*parsed) + " needs " + std::to_string(bytes);
    }
    out = Entry{name, *parsed, std::move(dims), begin, end};
    return "";
}

// Parses and checks the header; `entries_out` comes back sorted by position in the buffer.
std::string parse_header(const std::string& text, uint64_t buffer_bytes,
                         std::vector<Entry>& entries_out, SafetensorsFile& file_out) {
    // nlohmann keeps the last of duplicate keys silently, so the callback watches for them.
    std::vector<std::set<std::string>> open_objects;
    std::string duplicate;
    const json::parser_callback_t watch = [&](int, json::parse_event_t event, json& parsed) {
        if (event == json::parse_event_t::object_start) open_objects.emplace_back();
        if (event == json::parse_event_t::object_end && !open_objects.empty()) {
            open_objects.pop_back();
        }
        if (event == json::parse_event_t::key && !open_objects.empty() &&
            !open_objects.back().insert(parsed.get<std::string>()).second && duplicate.empty()) {
            duplicate = parsed.get<std::string>();
        }
        return true;
    };
    json header;
    try {
        header = json::parse(text, watch);
    } catch (const json::exception& e) {
        return std::string("header is not valid JSON: ") + e.what();
    }
    if (!header.is_object()) return "header is not a JSON object";
    if (!duplicate.empty()) return "duplicate name '" + duplicate + "' in the header";
    for (const auto& [name, value] : header.items()) {
        if (name == metadata_key) {
            if (!value.is_object()) return "\"__metadata__\" is not a JSON object";
            for (const auto& [k, v] : value.items()) {
                if (!v.is_string()) return "\"__metadata__\" value of '" + k + "' is not a string";
                file_out.metadata[k] = v.get<std::string>();
            }
            continue;
        }
        Entry entry;
        if (auto err = parse_entry(name, value, buffer_bytes, entry); !err.empty()) return err;
        entries_out.push_back(std::move(entry));
    }
    std::stable_sort(entries_out.begin(), entries_out.end(), [](const Entry& a, const Entry& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t pos = 0;
    const Entry* prev = nullptr;
    for (const Entry& e : entries_out) {
        if (e.begin < pos) {
            return "tensor '" + e.name + "' overlaps tensor '" + prev->name + "' in the buffer";
        }
        if (e.begin > pos) {
            return "hole of " + std::to_string(e.begin - pos) +
                   " bytes in the buffer before tensor '" + e.name + "'";
        }
        pos = e.end;
        prev = &e;
    }
    if (pos < buffer_bytes) {
        return std::to_string(buffer_bytes - pos) + " trailing bytes after the tensor data";
    }
    return "";
}

std::string read_into(const std::string& path, SafetensorsFile& file_out) {
    std::ifstream in(path, std::ios::binary);
    if (!in) return "cannot open the file: " + errno_str(errno);
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) return "not a regular file";
    const uint64_t file_bytes = fs::file_size(path, ec);
    if (ec) return "cannot get the file size: " + ec.message();
    if (file_bytes < 8) {
        return "file is " + std::to_string(file_bytes) +
               " bytes, shorter than the 8-byte header length";
    }
    unsigned char prefix[8];
    if (!in.read(reinterpret_cast<char*>(prefix), 8)) return "cannot read the header length";
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | prefix[i];
    if (header_bytes > max_header_bytes) {
        return "header length " + std::to_string(header_bytes) + " exceeds the limit of " +
               std::to_string(max_header_bytes) + " bytes";
    }
    if (header_bytes > file_bytes - 8) {
        return "header length " + std::to_string(header_bytes) + " is larger than the " +
               std::to_string(file_bytes - 8) + " bytes after the length prefix";
    }
    std::string text(header_bytes, '\0');
    if (!in.read(text.data(), static_cast<std::streamsize>(header_bytes))) {
        return "cannot read the header";
    }
    std::vector<Entry> entries;
    const uint64_t buffer_bytes = file_bytes - 8 - header_bytes;
    if (auto err = parse_header(text, buffer_bytes, entries, file_out); !err.empty()) return err;
    // Entries are contiguous from offset 0 now, so the tensors are read in one forward pass.
    for (Entry& e : entries) {
        TensorRecord t{std::move(e.name), e.dtype, std::move(e.shape), {}};
        t.bytes.resize(e.end - e.begin);
        if (!in.read(reinterpret_cast<char*>(t.bytes.data()),
                     static_cast<std::streamsize>(t.bytes.size()))) {
            return "file ended while reading tensor '" + t.name + "'";
        }
        file_out.tensors.push_back(std::move(t));
    }
    return "";
}

} // namespace

size_t dtype_bytes(TensorDType t) {
    switch (t) {
    case TensorDType::f32: return 4;
    case TensorDType::bf16: return 2;
    case TensorDType::f16: return 2;
    case TensorDType::i32: return 4;
    case TensorDType::i64: return 8;
    case TensorDType::f64: return 8;
    case TensorDType::f8_e4m3: return 1;
    case TensorDType::f8_e5m2: return 1;
    case TensorDType::i16: return 2;
    case TensorDType::i8: return 1;
    case TensorDType::u64: return 8;
    case TensorDType::u32: return 4;
    case TensorDType::u16: return 2;
    case TensorDType::u8: return 1;
    case TensorDType::boolean: return 1;
    }
    return 0;
}

const char* to_string(TensorDType t) {
    switch (t) {
    case TensorDType::f32: return "F32";
    case TensorDType::bf16: return "BF16";
    case TensorDType::f16: return "F16";
    case TensorDType::i32: return "I32";
    case TensorDType::i64: return "I64";
    case TensorDType::f64: return "F64";
    case TensorDType::f8_e4m3: return "F8_E4M3";
    case TensorDType::f8_e5m2: return "F8_E5M2";
    case TensorDType::i16: return "I16";
    case TensorDType::i8: return "I8";
    case TensorDType::u64: return "U64";
    case TensorDType::u32: return "U32";
    case TensorDType::u16: return "U16";
    case TensorDType::u8: return "U8";
    case TensorDType::boolean: return "BOOL";
    }
    return "?";
}

const TensorRecord* SafetensorsFile::find(std::string_view name) const {
    for (const TensorRecord& t : tensors) {
        if (t.name == name) return &t;
    }
    return nullptr;
}

std::string write_safetensors(const std::string& path, const SafetensorsFile& file) {
    std::string header;
    try {
        if (auto err = build_header(file, header); !err.empty()) return path + ": " + err;
    } catch (const std::exception& e) {
        return path + ": cannot build the header: " + e.what();
    }
    char prefix[8];
    for (int i = 0; i < 8; ++i)
        prefix[i] = static_cast<char>(static_cast<uint8_t>(uint64_t{header.size()} >> (8 * i)));
    std::vector<std::string_view> parts = {std::string_view(prefix, 8), header};
    for (const TensorRecord& t : file.tensors)
        parts.emplace_back(reinterpret_cast<const char*>(t.bytes.data()), t.bytes.size());
    return write_file_atomically(path, parts);
}

std::string read_safetensors(const std::string& path, SafetensorsFile& out) {
    out = SafetensorsFile{};
    SafetensorsFile result;
    std::string err;
    try {
        err = read_into(path, result);
    } catch (const std::exception& e) {
        err = std::string("unexpected failure: ") + e.what();
    }
    if (!err.empty()) return path + ": " + err;
    out = std::move(result);
    return "";
}

} // namespace dist::models
