// checkpoint.cpp: the mapping between Dist's parameters and Hugging Face tensors, and the
// checkpoint folder's files.
#include "models/checkpoint.hpp"

#include "kernels/tensor.hpp"
#include "lang/loader.hpp"
#include "models/atomic_file.hpp"
#include "models/safetensors.hpp"
#include "models/torch_checkpoint.hpp"

#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <unistd.h>

namespace fs = std::filesystem;

namespace dist::models {

namespace {

// Hugging Face's layouts: GPT-2's; Llama's (Mixtral and DeepSeek-MoE extend it with their
// mixtures of experts); or Dist's own names.
enum class Family { gpt2, llama, native };

Family family_of(const ModelSpec& spec) {
    if (spec.template_name == "gpt") return Family::gpt2;
    if (spec.template_name == "llama" || spec.template_name == "mixtral" ||
        spec.template_name == "deepseek_moe")
        return Family::llama;
    return Family::native;
}

// One external tensor holding rows [begin, end) of an internal parameter, maybe transposed.
struct Piece {
    std::string name;
    int64_t begin = 0, end = 0;
    bool transposed = false;
};

struct Mapping {
    std::map<std::string, std::vector<Piece>> pieces; // internal name -> pieces
};

void visit_layers(const ModelSpec& spec, const std::function<void(const LayerSpec&)>& f) {
    for (const auto& it : spec.pre)
        for (const auto& l : it.layers) f(l);
    for (const auto& b : spec.blocks)
        for (const auto& it : b.items)
            for (const auto& l : it.layers) f(l);
    for (const auto& it : spec.post)
        for (const auto& l : it.layers) f(l);
}

Mapping mapping_of(const ModelSpec& spec) {
    Mapping m;
    Family fam = family_of(spec);
    std::string prefix = fam == Family::llama ? "model." : "";
    auto whole = [&](const std::string& internal, const std::string& external, int64_t rows,
                     bool t = false) {
        m.pieces[internal].push_back({external, 0, rows, t});
    };
    visit_layers(spec, [&](const LayerSpec& l) {
        std::string in = l.name, ex = prefix + l.name;
        switch (l.kind) {
        case LayerKind::embedding: whole(in + ".weight", ex + ".weight", l.vocab); break;
        case LayerKind::position_embedding: whole(in + ".weight", ex + ".weight", l.context); break;
        case LayerKind::layer_norm:
        case LayerKind::rms_norm:
            whole(in + ".weight", ex + ".weight", l.width);
            if (l.kind == LayerKind::layer_norm && l.bias)
                whole(in + ".bias", ex + ".bias", l.width);
            break;
        case LayerKind::attention: {
            int64_t q = l.heads * l.head_dim, kv = l.kv_heads * l.head_dim;
            if (fam == Family::llama) {
                for (const char* part : {".weight", ".bias"}) {
                    if (std::string(part) == ".bias" && !l.bias) continue;
                    auto& v = m.pieces[in + ".qkv" + part];
                    v.push_back({ex + ".q_proj" + part, 0, q, false});
                    v.push_back({ex + ".k_proj" + part, q, q + kv, false});
                    v.push_back({ex + ".v_proj" + part, q + kv, q + 2 * kv, false});
                }
                whole(in + ".out.weight", ex + ".o_proj.weight", l.width);
                if (l.bias) whole(in + ".out.bias", ex + ".o_proj.bias", l.width);
            } else {
                bool t = fam == Family::gpt2;
                std::string qkv = t ? ".c_attn" : ".qkv", out = t ? ".c_proj" : ".out";
                whole(in + ".qkv.weight", ex + qkv + ".weight", q + 2 * kv, t);
                whole(in + ".out.weight", ex + out + ".weight", l.width, t);
                if (l.bias) {
                    whole(in + ".qkv.bias", ex + qkv + ".bias", q + 2 * kv);
                    whole(in + ".out.bias", ex + out + ".bias", l.width);
                }
            }
            break;
        }
        case LayerKind::mlp: {
            bool glu = l.activation == Activation::swiglu;
            int64_t fc_rows = glu ? 2 * l.hidden : l.hidden;
            if (fam == Family::llama) {
                auto& v = m.pieces[in + ".fc.weight"];
                if (glu) {
                    v.push_back({ex + ".gate_proj.weight", 0, l.hidden, false});
                    v.push_back({ex + ".up_proj.weight", l.hidden, 2 * l.hidden, false});
                } else {
                    v.push_back({ex + ".up_proj.weight", 0, l.hidden, false});
                }
                whole(in + ".proj.weight", ex + ".down_proj.weight", l.width);
            } else {
                bool t = fam == Family::gpt2;
                std::string fc = t ? ".c_fc" : ".fc", proj = t ? ".c_proj" : ".proj";
                whole(in + ".fc.weight", ex + fc + ".weight", fc_rows, t);
                whole(in + ".proj.weight", ex + proj + ".weight", l.width, t);
                if (l.bias) {
                    whole(in + ".fc.bias", ex + fc + ".bias", fc_rows);
                    whole(in + ".proj.bias", ex + proj + ".bias", l.width);
                }
            }
            break;
        }
        case LayerKind::lm_head:
            // A tied head has no tensor of its own; Hugging Face's head is never prefixed.
            if (!l.tied) whole(in + ".weight", l.name + ".weight", l.vocab);
            if (l.bias) whole(in + ".bias", l.name + ".bias", l.vocab);
            break;
        case LayerKind::rotary_embedding:
        case LayerKind::cross_entropy: break;
        case LayerKind::moe: {
            // Mixtral: block_sparse_moe.gate, experts.E.w1 (gate) / w3 (up) / w2 (down).
            // DeepSeek-MoE: mlp.gate, experts.E.gate_proj / up_proj / down_proj, and one
            // shared_experts MLP of shared x shared_hidden units.
            const bool glu = l.activation == Activation::swiglu;
            const bool mixtral = spec.template_name == "mixtral";
            auto expert = [&](const std::string& internal, const std::string& external,
                              int64_t hidden) {
                if (fam != Family::llama) {
                    whole(internal + ".fc.weight", external + ".fc.weight",
                          glu ? 2 * hidden : hidden);
                    whole(internal + ".proj.weight", external + ".proj.weight", l.width);
                    return;
                }
                auto& v = m.pieces[internal + ".fc.weight"];
                std::string gate = mixtral ? ".w1" : ".gate_proj",
                            up = mixtral ? ".w3" : ".up_proj";
                if (glu) {
                    v.push_back({external + gate + ".weight", 0, hidden, false});
                    v.push_back({external + up + ".weight", hidden, 2 * hidden, false});
                } else {
                    v.push_back({external + up + ".weight", 0, hidden, false});
                }
                whole(internal + ".proj.weight",
                      external + (mixtral ? ".w2" : ".down_proj") + ".weight", l.width);
            };
            whole(in + ".router.weight",
                  ex + (fam == Family::llama ? ".gate" : ".router") + ".weight", l.experts);
            for (int64_t e = 0; e < l.experts; ++e)
                expert(in + ".experts." + std::to_string(e), ex + ".experts." + std::to_string(e),
                       l.hidden);
            if (l.shared_experts > 0)
                expert(in + ".shared", ex + (fam == Family::llama ? ".shared_experts" : ".shared"),
                       l.shared_experts * l.shared_hidden);
            break;
        }
        }
    });
    return m;
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string out = "[";
    for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
    return out + "]";
}

// The external shape of a piece of a parameter.
std::vector<int64_t> piece_shape(const Parameter& p, const Piece& piece) {
    std::vector<int64_t> s = p.value.shape();
    s[0] = piece.end - piece.begin;
    if (piece.transposed && s.size() == 2) std::swap(s[0], s[1]);
    return s;
}

TensorRecord export_piece(const Parameter& p, const Piece& piece) {
    TensorRecord r;
    r.name = piece.name;
    r.dtype = TensorDType::f32;
    r.shape = piece_shape(p, piece);
    int64_t cols = p.value.rank() == 2 ? p.value.dim(1) : 1;
    int64_t rows = piece.end - piece.begin;
    std::vector<float> out(static_cast<size_t>(rows * cols));
    const float* src = p.value.data<float>() + piece.begin * cols;
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
            out[static_cast<size_t>(piece.transposed ? j * rows + i : i * cols + j)] =
                src[i * cols + j];
    r.bytes.resize(out.size() * sizeof(float));
    std::memcpy(r.bytes.data(), out.data(), r.bytes.size());
    return r;
}

std::string import_piece(const TensorRecord& r, const Piece& piece, Parameter& p) {
    std::vector<int64_t> want = piece_shape(p, piece);
    if (r.shape != want)
        return "tensor `" + r.name + "` has shape " + shape_str(r.shape) + ", but the script's " +
               "model expects " + shape_str(want);
    int64_t cols = p.value.rank() == 2 ? p.value.dim(1) : 1;
    int64_t rows = piece.end - piece.begin;
    std::vector<float> vals(static_cast<size_t>(rows * cols));
    if (r.dtype == TensorDType::f32) {
        std::memcpy(vals.data(), r.bytes.data(), vals.size() * sizeof(float));
    } else if (r.dtype == TensorDType::bf16 || r.dtype == TensorDType::f16) {
        const bool brain = r.dtype == TensorDType::bf16;
        for (size_t i = 0; i < vals.size(); ++i) {
            uint16_t b;
            std::memcpy(&b, r.bytes.data() + 2 * i, 2);
            vals[i] = brain ? kernels::bf16_to_f32(b) : kernels::f16_to_f32(b);
        }
    } else if (r.dtype == TensorDType::f64) {
        for (size_t i = 0; i < vals.size(); ++i) {
            double d;
            std::memcpy(&d, r.bytes.data() + 8 * i, 8);
            vals[i] = static_cast<float>(d);
        }
    } else {
        return "tensor `" + r.name + "` is " + to_string(r.dtype) +
               "; weights are F32, BF16, F16 or F64";
    }
    float* dst = p.value.data<float>() + piece.begin * cols;
    for (int64_t i = 0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j)
            dst[i * cols + j] =
                vals[static_cast<size_t>(piece.transposed ? j * rows + i : i * cols + j)];
    return {};
}

// Hugging Face folders name tensors with or without the model class's prefix.
const TensorRecord* find_tensor(const SafetensorsFile& f, const std::string& name) {
    if (const TensorRecord* r = f.find(name)) return r;
    if (const TensorRecord* r = f.find("transformer." + name)) return r;
    if (name.rfind("model.", 0) == 0)
        if (const TensorRecord* r = f.find(name.substr(6))) return r;
    if (const TensorRecord* r = f.find("model." + name)) return r;
    return nullptr;
}

nlohmann::json config_of(const ModelSpec& spec) {
    const LayerSpec* attn = nullptr;
    const LayerSpec* mlp = nullptr;
    const LayerSpec* norm = nullptr;
    const LayerSpec* head = nullptr;
    const LayerSpec* moe = nullptr;
    double theta = 0;
    int64_t dense = 0; // blocks before the first with experts
    visit_layers(spec, [&](const LayerSpec& l) {
        if (l.kind == LayerKind::moe && !moe) moe = &l;
        if (l.kind == LayerKind::mlp && !moe) ++dense;
        if (l.kind == LayerKind::attention && !attn) attn = &l;
        if (l.kind == LayerKind::mlp && !mlp) mlp = &l;
        if ((l.kind == LayerKind::layer_norm || l.kind == LayerKind::rms_norm) && !norm) norm = &l;
        if (l.kind == LayerKind::lm_head) head = &l;
        if (l.kind == LayerKind::rotary_embedding) theta = l.theta;
    });
    nlohmann::json args = nlohmann::json::object();
    for (const auto& [k, v] : spec.arguments)
        if (v.type == lang::Value::Type::integer) args[k] = v.i;
    int64_t layers = static_cast<int64_t>(spec.blocks.size());
    switch (family_of(spec)) {
    case Family::gpt2:
        return {{"architectures", {"GPT2LMHeadModel"}},
                {"model_type", "gpt2"},
                {"vocab_size", spec.vocab},
                {"n_positions", spec.context},
                {"n_ctx", spec.context},
                {"n_embd", spec.width},
                {"n_layer", layers},
                {"n_head", attn->heads},
                {"n_inner", nullptr},
                {"activation_function", "gelu_new"},
                {"layer_norm_epsilon", norm->eps},
                {"tie_word_embeddings", head->tied},
                {"torch_dtype", "float32"},
                {"dist_template", args}};
    case Family::llama: {
        // Llama's fields; Mixtral and DeepSeek-MoE add their experts'.
        nlohmann::json c = {{"architectures", {"LlamaForCausalLM"}},
                            {"model_type", "llama"},
                            {"vocab_size", spec.vocab},
                            {"max_position_embeddings", spec.context},
                            {"hidden_size", spec.width},
                            {"intermediate_size", mlp   ? mlp->hidden
                                                  : moe ? moe->hidden
                                                        : 0},
                            {"num_hidden_layers", layers},
                            {"num_attention_heads", attn->heads},
                            {"num_key_value_heads", attn->kv_heads},
                            {"head_dim", attn->head_dim},
                            {"rms_norm_eps", norm->eps},
                            {"rope_theta", theta},
                            {"hidden_act", "silu"},
                            {"tie_word_embeddings", head->tied},
                            {"torch_dtype", "float32"},
                            {"dist_template", args}};
        if (!moe) return c;
        c["num_experts_per_tok"] = moe->top_k;
        if (spec.template_name == "mixtral") {
            c["architectures"] = {"MixtralForCausalLM"};
            c["model_type"] = "mixtral";
            c["intermediate_size"] = moe->hidden;
            c["num_local_experts"] = moe->experts;
            c["router_aux_loss_coef"] = moe->aux_loss;
        } else {
            c["architectures"] = {"DeepseekForCausalLM"};
            c["model_type"] = "deepseek";
            c["moe_intermediate_size"] = moe->hidden;
            c["n_routed_experts"] = moe->experts;
            c["n_shared_experts"] = moe->shared_experts;
            c["first_k_dense_replace"] = dense;
            c["norm_topk_prob"] = moe->normalize;
            c["aux_loss_alpha"] = moe->aux_loss;
        }
        return c;
    }
    case Family::native: break;
    }
    return {{"model_type", "dist"},
            {"dist_template_name", spec.template_name},
            {"dist_template", args}};
}

} // namespace

std::string external_name(const ModelSpec& spec, const std::string& internal) {
    Mapping m = mapping_of(spec);
    auto it = m.pieces.find(internal);
    if (it == m.pieces.end() || it->second.empty()) return internal;
    return it->second.front().name;
}

namespace {

// The files of a Dist checkpoint, in the order they are moved into place.
const char* const checkpoint_files[] = {"model.safetensors", "config.json", "optimizer.safetensors",
                                        "state.json"};

// A save writes every file into `pending` below the folder, then the marker, and only then moves
// the files up one by one: a save cut short before the marker leaves the folder's files as
// they were (the last whole checkpoint); one cut short after it is finished by the next reader
// (which takes the files still pending) or the next save (which moves them).
fs::path pending_of(const fs::path& dir) {
    return dir / ".pending";
}
constexpr const char* commit_marker = "COMMIT";

// Where a checkpoint's file is read from: the pending copy when a committed save did not move
// it yet, else the folder's.
fs::path checkpoint_file(const fs::path& dir, const std::string& name) {
    std::error_code ec;
    const fs::path pending = pending_of(dir);
    if (fs::exists(pending / commit_marker, ec) && fs::exists(pending / name, ec))
        return pending / name;
    return dir / name;
}

// Finishes a committed save's moves, or drops an uncommitted one.
std::string settle_pending(const fs::path& dir) {
    std::error_code ec;
    const fs::path pending = pending_of(dir);
    if (!fs::exists(pending, ec)) return {};
    if (fs::exists(pending / commit_marker, ec))
        for (const char* name : checkpoint_files) {
            if (!fs::exists(pending / name, ec)) continue;
            fs::rename(pending / name, dir / name, ec);
            if (ec)
                return "cannot move `" + (pending / name).string() + "` into `" + dir.string() +
                       "`: " + ec.message();
        }
    // The moves reach the disk before the pending folder goes.
    if (int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY); fd >= 0) {
        ::fsync(fd);
        ::close(fd);
    }
    fs::remove_all(pending, ec);
    if (ec) return "cannot remove `" + pending.string() + "`: " + ec.message();
    return {};
}

} // namespace

namespace {

// An f32 record's values rounded to BF16, in place.
void to_bf16(TensorRecord& r) {
    const size_t n = r.bytes.size() / 4;
    std::vector<uint8_t> out(n * 2);
    for (size_t i = 0; i < n; ++i) {
        float x;
        std::memcpy(&x, r.bytes.data() + 4 * i, 4);
        const uint16_t b = kernels::f32_to_bf16(x);
        std::memcpy(out.data() + 2 * i, &b, 2);
    }
    r.dtype = TensorDType::bf16;
    r.bytes = std::move(out);
}

} // namespace

std::string save_checkpoint(const std::string& dir, Model& model, int64_t step, uint64_t seed,
                            bool bf16_weights) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) return "cannot create the folder `" + dir + "`: " + ec.message();
    Mapping m = mapping_of(model.spec());
    SafetensorsFile weights, optimizer;
    weights.metadata = {{"format", "pt"}, {"dist_step", std::to_string(step)}};
    optimizer.metadata = {{"dist_step", std::to_string(step)}};
    for (auto& p : model.params().all()) {
        auto it = m.pieces.find(p.name);
        if (it == m.pieces.end()) return "no checkpoint name for parameter `" + p.name + "`";
        for (const auto& piece : it->second) {
            weights.tensors.push_back(export_piece(p, piece));
            if (bf16_weights) to_bf16(weights.tensors.back());
        }
        for (auto [suffix, t] : {std::pair{".m", &p.m}, std::pair{".v", &p.v}}) {
            TensorRecord r{p.name + suffix, TensorDType::f32, t->shape(), {}};
            r.bytes.resize(t->bytes());
            std::memcpy(r.bytes.data(), t->raw(), t->bytes());
            optimizer.tensors.push_back(std::move(r));
        }
    }
    const fs::path d(dir), pending = pending_of(d);
    if (std::string e = settle_pending(d); !e.empty()) return e;
    fs::create_directories(pending, ec);
    if (ec) return "cannot create the folder `" + pending.string() + "`: " + ec.message();
    if (std::string e = write_safetensors((pending / "model.safetensors").string(), weights);
        !e.empty())
        return e;
    std::string config = config_of(model.spec()).dump(2) + "\n";
    if (std::string e = write_file_atomically((pending / "config.json").string(), {config});
        !e.empty())
        return e;
    if (std::string e = write_safetensors((pending / "optimizer.safetensors").string(), optimizer);
        !e.empty())
        return e;
    nlohmann::json state = {{"format", "dist-checkpoint-1"}, {"step", step}, {"seed", seed}};
    std::string state_text = state.dump(2) + "\n";
    if (std::string e = write_file_atomically((pending / "state.json").string(), {state_text});
        !e.empty())
        return e;
    const std::string marker = std::to_string(step) + "\n";
    if (std::string e = write_file_atomically((pending / commit_marker).string(), {marker});
        !e.empty())
        return e;
    return settle_pending(d);
}

namespace {

// Copies the model's parameters out of `weights` (read from `file`, named in messages).
std::string import_weights(const SafetensorsFile& weights, const std::string& file, Model& model) {
    Mapping m = mapping_of(model.spec());
    for (auto& p : model.params().all()) {
        for (const auto& piece : m.pieces.at(p.name)) {
            const TensorRecord* r = find_tensor(weights, piece.name);
            if (!r)
                return "`" + file + "` has no tensor `" + piece.name + "` (expected shape " +
                       shape_str(piece_shape(p, piece)) + "); is it a checkpoint of this model?";
            if (std::string e = import_piece(*r, piece, p); !e.empty())
                return "`" + file + "`: " + e;
        }
    }
    return {};
}

std::string load_weights_file(const fs::path& file, Model& model, std::string& step_stamp) {
    SafetensorsFile weights;
    if (std::string e = read_safetensors(file.string(), weights); !e.empty()) return e;
    auto stamp = weights.metadata.find("dist_step");
    step_stamp = stamp == weights.metadata.end() ? "" : stamp->second;
    return import_weights(weights, file.string(), model);
}

using ShardReader = std::string (*)(const std::string&, SafetensorsFile&);

// A sharded Hugging Face folder: `index` maps every tensor name to the shard file holding it
// ({"weight_map": {"h.0.ln_1.weight": "model-00001-of-00002.safetensors", ...}}). Reads every
// shard into one SafetensorsFile; a shard outside the folder, a tensor missing from the shard
// the index names, or a tensor in two shards is refused.
std::string read_sharded(const fs::path& index, ShardReader read, SafetensorsFile& out) {
    std::string text, error;
    if (!lang::read_source_file(index, text, error))
        return "cannot read `" + index.string() + "`: " + error;
    nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object())
        return "`" + index.string() + "` is not a Hugging Face shard index (no \"weight_map\")";
    std::map<std::string, std::vector<std::string>> by_shard;
    for (const auto& [name, shard] : j["weight_map"].items()) {
        if (!shard.is_string())
            return "`" + index.string() + "`: the shard of `" + name + "` is not a file name";
        const std::string s = shard.get<std::string>();
        if (s.empty() || s.find('/') != std::string::npos || s.find('\\') != std::string::npos ||
            s == "." || s == "..")
            return "`" + index.string() + "`: shard `" + s + "` (of `" + name +
                   "`) is not a file in the same folder";
        by_shard[s].push_back(name);
    }
    std::map<std::string, std::string> seen; // tensor -> shard
    for (const auto& [shard, names] : by_shard) {
        SafetensorsFile part;
        const fs::path file = index.parent_path() / shard;
        if (std::string e = read(file.string(), part); !e.empty()) return e;
        for (const std::string& name : names)
            if (!part.find(name))
                return "`" + index.string() + "` places `" + name + "` in `" + shard +
                       "`, which has no such tensor";
        for (TensorRecord& t : part.tensors) {
            if (auto [it, fresh] = seen.emplace(t.name, shard); !fresh)
                return "tensor `" + t.name + "` is in two shards: `" + it->second + "` and `" +
                       shard + "`";
            out.tensors.push_back(std::move(t));
        }
    }
    return {};
}

} // namespace

std::string load_weights(const std::string& dir, Model& model) {
    fs::path d(dir);
    std::error_code ec;
    if (!fs::is_directory(d, ec)) return "`" + dir + "` is not a checkpoint folder";
    // The layouts Hugging Face writes, in the order it prefers them.
    struct Layout {
        const char* file;
        bool index;
        ShardReader read;
    };
    for (const Layout& l : {Layout{"model.safetensors", false, &read_safetensors},
                            Layout{"model.safetensors.index.json", true, &read_safetensors},
                            Layout{"pytorch_model.bin", false, &read_torch_checkpoint},
                            Layout{"pytorch_model.bin.index.json", true, &read_torch_checkpoint}}) {
        const fs::path file = checkpoint_file(d, l.file);
        if (!fs::exists(file, ec)) continue;
        SafetensorsFile weights;
        std::string e =
            l.index ? read_sharded(file, l.read, weights) : l.read(file.string(), weights);
        if (!e.empty()) return e;
        return import_weights(weights, file.string(), model);
    }
    return "`" + dir +
           "` holds no model.safetensors, model.safetensors.index.json, pytorch_model.bin or "
           "pytorch_model.bin.index.json (Dist and Hugging Face folders hold one of them)";
}

std::string load_training_state(const std::string& dir, Model& model, int64_t& step) {
    fs::path d(dir);
    std::string text, error;
    const fs::path state_file = checkpoint_file(d, "state.json");
    if (!lang::read_source_file(state_file, text, error))
        return "cannot read `" + state_file.string() + "`: " + error +
               "; a folder to resume from is one that `dist run --save` wrote";
    nlohmann::json state = nlohmann::json::parse(text, nullptr, false);
    if (state.is_discarded() || !state.is_object() || !state.contains("step") ||
        !state["step"].is_number_integer() || state["step"].get<int64_t>() < 0)
        return "`" + state_file.string() + "` is not a Dist training state";
    step = state["step"].get<int64_t>();
    std::string stamp;
    if (std::string e = load_weights_file(checkpoint_file(d, "model.safetensors"), model, stamp);
        !e.empty())
        return e;
    SafetensorsFile opt;
    const fs::path opt_file = checkpoint_file(d, "optimizer.safetensors");
    if (std::string e = read_safetensors(opt_file.string(), opt); !e.empty()) return e;
    std::string opt_stamp = opt.metadata.count("dist_step") ? opt.metadata.at("dist_step") : "";
    if (stamp != std::to_string(step) || opt_stamp != std::to_string(step))
        return "`" + dir + "` mixes files of different steps (state " + std::to_string(step) +
               ", model " + (stamp.empty() ? "?" : stamp) + ", optimizer " +
               (opt_stamp.empty() ? "?" : opt_stamp) +
               "): an interrupted save; use an older "
               "checkpoint";
    for (auto& p : model.params().all()) {
        for (auto [suffix, t] : {std::pair{".m", &p.m}, std::pair{".v", &p.v}}) {
            const TensorRecord* r = opt.find(p.name + suffix);
            if (!r || r->dtype != TensorDType::f32 || r->shape != t->shape())
                return "`" + opt_file.string() + "` has no matching `" + p.name + suffix + "`";
            std::memcpy(t->raw(), r->bytes.data(), t->bytes());
        }
    }
    return {};
}

} // namespace dist::models
