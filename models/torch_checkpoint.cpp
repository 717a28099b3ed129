// torch_checkpoint.cpp: the ZIP container, a restricted pickle interpreter and tensor gathering
// for torch.save files. See the header for the format and why this is not a general unpickler.
#include "models/torch_checkpoint.hpp"

#include <array>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <unordered_map>
#include <utility>

namespace dist::models {

namespace {

// ---- ZIP --------------------------------------------------------------------------------------

[[maybe_unused]] uint32_t crc32_of(const uint8_t* data, size_t n) {
    static const std::array<uint32_t, 256> table = [] {
        std::array<uint32_t, 256> t{};
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) c = table[(c ^ data[i]) & 0xff] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint64_t le(const uint8_t* p, int bytes) {
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

struct ZipEntry {
    uint64_t local_offset = 0;
    uint64_t size = 0;
    uint32_t crc = 0;
};

// The archive: its central directory, read and checked up front, and reads of whole entries.
class Zip {
  public:
    std::string open(const std::string& path) {
        in_.open(path, std::ios::binary);
        if (!in_) return "cannot open it";
        in_.seekg(0, std::ios::end);
        size_ = static_cast<uint64_t>(in_.tellg());
        if (size_ < 4) return "it is too short to be a PyTorch checkpoint";
        uint8_t magic[4];
        if (!read_at(0, magic, 4)) return "cannot read it";
        if (magic[0] == 0x80 && magic[1] == 0x02)
            return "it is in PyTorch's legacy format (before 1.6, not a ZIP archive), which Dist "
                   "does not read; load it in PyTorch and save it again, or convert it to "
                   "safetensors";
        if (le(magic, 4) != 0x04034b50) return "it is neither a ZIP archive nor a PyTorch file";
        return read_directory();
    }

    uint64_t file_size() const { return size_; }

    const ZipEntry* find(const std::string& name) const {
        auto it = entries_.find(name);
        return it == entries_.end() ? nullptr : &it->second;
    }
    const std::map<std::string, ZipEntry>& entries() const { return entries_; }

    // The bytes of `name`, CRC-checked.
    std::string read(const std::string& name, std::vector<uint8_t>& out) {
        const ZipEntry* e = find(name);
        if (!e) return "the archive has no entry `" + name + "`";
        uint8_t local[30];
        if (e->local_offset > size_ - 30 || !read_at(e->local_offset, local, 30) ||
            le(local, 4) != 0x04034b50)
            return "entry `" + name + "` has no local header where the directory says";
        const uint64_t data = e->local_offset + 30 + le(local + 26, 2) + le(local + 28, 2);
        if (data > size_ || e->size > size_ - data)
            return "entry `" + name + "` runs past the end of the file (truncated?)";
        out.resize(e->size);
        if (e->size && !read_at(data, out.data(), e->size))
            return "cannot read entry `" + name + "`";
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION // the fuzzer's mutations reach the pickle
        if (crc32_of(out.data(), out.size()) != e->crc)
            return "entry `" + name + "` fails its CRC check (the file is corrupt)";
#endif
        return {};
    }

  private:
    bool read_at(uint64_t offset, uint8_t* dst, uint64_t n) {
        in_.clear();
        in_.seekg(static_cast<std::streamoff>(offset));
        in_.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(n));
        return static_cast<uint64_t>(in_.gcount()) == n;
    }

    std::string read_directory() {
        // The end-of-directory record: 22 bytes plus a comment of up to 64 KiB, at the end.
        const uint64_t tail_len = std::min<uint64_t>(size_, 22 + 65535);
        std::vector<uint8_t> tail(tail_len);
        if (tail_len < 22 || !read_at(size_ - tail_len, tail.data(), tail_len))
            return "it is not a complete ZIP archive (no end-of-directory record; truncated?)";
        int64_t at = -1;
        for (int64_t i = static_cast<int64_t>(tail_len) - 22; i >= 0; --i) {
            const uint8_t* p = tail.data() + i;
            if (le(p, 4) == 0x06054b50 && i + 22 + le(p + 20, 2) <= tail_len) {
                at = i;
                break;
            }
        }
        if (at < 0)
            return "it is not a complete ZIP archive (no end-of-directory record; truncated?)";
        const uint8_t* eocd = tail.data() + at;
        uint64_t count = le(eocd + 10, 2), dir_size = le(eocd + 12, 4),
                 dir_offset = le(eocd + 16, 4);
        if (count == 0xffff || dir_size == 0xffffffff || dir_offset == 0xffffffff) {
            // ZIP64: a locator just before the record points at the 64-bit record.
            const uint64_t eocd_pos = size_ - tail_len + static_cast<uint64_t>(at);
            uint8_t loc[20], rec[56];
            if (eocd_pos < 20 || !read_at(eocd_pos - 20, loc, 20) || le(loc, 4) != 0x07064b50)
                return "its ZIP64 end-of-directory locator is missing";
            const uint64_t rec_pos = le(loc + 8, 8);
            if (rec_pos > size_ - 56 || !read_at(rec_pos, rec, 56) || le(rec, 4) != 0x06064b50)
                return "its ZIP64 end-of-directory record is missing";
            count = le(rec + 32, 8);
            dir_size = le(rec + 40, 8);
            dir_offset = le(rec + 48, 8);
        }
        if (dir_offset > size_ || dir_size > size_ - dir_offset || count > dir_size / 46)
            return "its ZIP directory lies outside the file (truncated or corrupt)";
        std::vector<uint8_t> dir(dir_size);
        if (dir_size && !read_at(dir_offset, dir.data(), dir_size)) return "cannot read it";
        uint64_t pos = 0;
        for (uint64_t n = 0; n < count; ++n) {
            if (dir_size - pos < 46 || le(dir.data() + pos, 4) != 0x02014b50)
                return "its ZIP directory is corrupt (entry " + std::to_string(n) + ")";
            const uint8_t* h = dir.data() + pos;
            const uint64_t flags = le(h + 8, 2), method = le(h + 10, 2);
            const uint64_t name_len = le(h + 28, 2), extra_len = le(h + 30, 2),
                           comment_len = le(h + 32, 2);
            if (dir_size - pos - 46 < name_len + extra_len + comment_len)
                return "its ZIP directory is corrupt (entry " + std::to_string(n) + ")";
            std::string name(reinterpret_cast<const char*>(h + 46), name_len);
            ZipEntry e;
            e.crc = static_cast<uint32_t>(le(h + 16, 4));
            uint64_t compressed = le(h + 20, 4);
            e.size = le(h + 24, 4);
            e.local_offset = le(h + 42, 4);
            // ZIP64 extra field: the 64-bit values of those that are 0xffffffff, in order.
            const uint8_t* x = h + 46 + name_len;
            for (uint64_t xp = 0; xp + 4 <= extra_len;) {
                const uint64_t id = le(x + xp, 2), len = le(x + xp + 2, 2);
                if (xp + 4 + len > extra_len) break;
                if (id == 0x0001) {
                    const uint8_t* v = x + xp + 4;
                    uint64_t used = 0;
                    for (uint64_t* field : {&e.size, &compressed, &e.local_offset}) {
                        if (*field != 0xffffffff) continue;
                        if (used + 8 > len) return "entry `" + name + "` has a short ZIP64 field";
                        *field = le(v + used, 8);
                        used += 8;
                    }
                }
                xp += 4 + len;
            }
            if (flags & 1) return "entry `" + name + "` is encrypted";
            if (method != 0 || compressed != e.size)
                return "entry `" + name + "` is compressed (method " + std::to_string(method) +
                       "); torch.save stores entries uncompressed";
            if (!entries_.emplace(name, e).second)
                return "its ZIP directory names `" + name + "` twice";
            pos += 46 + name_len + extra_len + comment_len;
        }
        return {};
    }

    std::ifstream in_;
    uint64_t size_ = 0;
    std::map<std::string, ZipEntry> entries_;
};

// ---- Pickle -----------------------------------------------------------------------------------

// A value on the pickle machine's stack. All values live in the machine's arena and refer to each
// other by plain pointers, so neither deep nesting nor a cycle (a list appended to itself) can
// overflow the stack or leak when the machine goes.
struct Value {
    enum class Kind {
        none,
        boolean,
        integer,
        floating,
        string,
        bytes,
        tuple,
        list,
        dict,
        global,
        storage,
        tensor
    };
    Kind kind = Kind::none;
    int64_t i = 0;             // integer, boolean; storage: element count; tensor: storage offset
    double f = 0;              // floating
    std::string s;             // string, bytes; global: "module.name"; storage: key
    std::vector<Value*> items; // tuple, list
    std::vector<std::pair<Value*, Value*>> entries; // dict
    std::unordered_map<std::string, size_t> index;  // dict: entry of each str key
    TensorDType dtype = TensorDType::f32;           // storage, tensor
    const Value* storage = nullptr;                 // tensor
    std::vector<int64_t> sizes, strides;            // tensor
};

const char* kind_name(Value::Kind k) {
    switch (k) {
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return "a bool";
    case Value::Kind::integer: return "an int";
    case Value::Kind::floating: return "a float";
    case Value::Kind::string: return "a str";
    case Value::Kind::bytes: return "bytes";
    case Value::Kind::tuple: return "a tuple";
    case Value::Kind::list: return "a list";
    case Value::Kind::dict: return "a dict";
    case Value::Kind::global: return "a class or function";
    case Value::Kind::storage: return "a storage";
    case Value::Kind::tensor: return "a tensor";
    }
    return "?";
}

// torch's storage classes and the element type each holds.
const std::map<std::string, TensorDType>& storage_types() {
    static const std::map<std::string, TensorDType> types = {
        {"torch.FloatStorage", TensorDType::f32}, {"torch.DoubleStorage", TensorDType::f64},
        {"torch.HalfStorage", TensorDType::f16},  {"torch.BFloat16Storage", TensorDType::bf16},
        {"torch.LongStorage", TensorDType::i64},  {"torch.IntStorage", TensorDType::i32},
        {"torch.ShortStorage", TensorDType::i16}, {"torch.CharStorage", TensorDType::i8},
        {"torch.ByteStorage", TensorDType::u8},   {"torch.BoolStorage", TensorDType::boolean}};
    return types;
}

// The globals a state dict names; nothing else may appear in the file.
bool allowed_global(const std::string& name) {
    static const std::set<std::string> allowed = {"collections.OrderedDict",
                                                  "torch._utils._rebuild_tensor",
                                                  "torch._utils._rebuild_tensor_v2",
                                                  "torch._utils._rebuild_parameter",
                                                  "torch._utils._rebuild_parameter_with_state",
                                                  "torch._tensor._rebuild_from_type_v2",
                                                  "torch.Tensor",
                                                  "torch.nn.parameter.Parameter"};
    return allowed.count(name) || storage_types().count(name);
}

class Unpickler {
  public:
    Unpickler(const std::vector<uint8_t>& data) : p_(data) {}

    // Runs the program; on success `result` is the pickled object.
    std::string run(const Value*& result) {
        try {
            result = execute();
            return {};
        } catch (const Failure& f) {
            return "data.pkl, byte " + std::to_string(op_at_) + ": " + f.what;
        }
    }

  private:
    struct Failure {
        std::string what;
    };
    [[noreturn]] void fail(std::string what) { throw Failure{std::move(what)}; }

    Value* make(Value::Kind k) {
        if (arena_.size() > p_.size() + 16) fail("more values than the program could make");
        arena_.push_back(std::make_unique<Value>());
        arena_.back()->kind = k;
        return arena_.back().get();
    }

    const uint8_t* take(uint64_t n) {
        if (n > p_.size() - pos_) fail("the program ends in the middle of an instruction");
        const uint8_t* p = p_.data() + pos_;
        pos_ += n;
        return p;
    }
    uint64_t uint_arg(int bytes) { return le(take(bytes), bytes); }
    std::string line() {
        std::string s;
        for (;;) {
            char c = static_cast<char>(*take(1));
            if (c == '\n') return s;
            if (s.size() > 256) fail("a global's name is too long");
            s += c;
        }
    }

    void push(Value* v) {
        if (stack_.size() > 100000) fail("the stack grows beyond any state dict's");
        stack_.push_back(v);
    }
    Value* pop() {
        if (stack_.size() <= floor()) fail("an instruction needs a value the stack does not hold");
        Value* v = stack_.back();
        stack_.pop_back();
        return v;
    }
    Value* top() {
        if (stack_.size() <= floor()) fail("an instruction needs a value the stack does not hold");
        return stack_.back();
    }
    size_t floor() const { return marks_.empty() ? 0 : marks_.back(); }
    std::vector<Value*> pop_to_mark() {
        if (marks_.empty()) fail("an instruction needs a mark and there is none");
        std::vector<Value*> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()),
                                  stack_.end());
        stack_.resize(marks_.back());
        marks_.pop_back();
        return items;
    }
    Value* tuple(std::vector<Value*> items) {
        Value* t = make(Value::Kind::tuple);
        t->items = std::move(items);
        return t;
    }
    Value* string(Value::Kind k, uint64_t n) {
        Value* v = make(k);
        const uint8_t* p = take(n);
        v->s.assign(reinterpret_cast<const char*>(p), n);
        return v;
    }
    Value* global(const std::string& module, const std::string& name) {
        const std::string full = module + "." + name;
        if (!allowed_global(full))
            fail("the file names `" + full +
                 "`, which a state dict does not use; refusing to load it (only tensors, "
                 "dicts, lists and numbers are read)");
        Value* g = make(Value::Kind::global);
        g->s = full;
        return g;
    }
    Value* integer(int64_t i) {
        Value* v = make(Value::Kind::integer);
        v->i = i;
        return v;
    }

    void memo_put(uint64_t index) {
        if (index > p_.size()) fail("a memo index beyond any the program could use");
        memo_[index] = top();
    }
    Value* memo_get(uint64_t index) {
        auto it = memo_.find(index);
        if (it == memo_.end())
            fail("the program reads memo slot " + std::to_string(index) + ", which it never wrote");
        return it->second;
    }

    static void want(bool ok, const std::string& what, const Value* v, const char* expected) {
        if (!ok) throw Failure{what + " is " + kind_name(v->kind) + ", not " + expected};
    }
    std::vector<int64_t> ints(const Value* v, const char* what) {
        want(v->kind == Value::Kind::tuple || v->kind == Value::Kind::list, what, v, "a tuple");
        std::vector<int64_t> out;
        for (const Value* x : v->items) {
            want(x->kind == Value::Kind::integer, std::string("an element of ") + what, x,
                 "an int");
            if (x->i < 0) fail(std::string(what) + " has a negative entry");
            out.push_back(x->i);
        }
        return out;
    }

    // torch._utils._rebuild_tensor_v2(storage, offset, sizes, strides, ...).
    Value* rebuild_tensor(const Value* args) {
        if (args->items.size() < 4) fail("a tensor is rebuilt from fewer than 4 arguments");
        const Value* storage = args->items[0];
        want(storage->kind == Value::Kind::storage, "a tensor's storage", storage, "a storage");
        const Value* offset = args->items[1];
        want(offset->kind == Value::Kind::integer, "a tensor's offset", offset, "an int");
        if (offset->i < 0) fail("a tensor has a negative storage offset");
        Value* t = make(Value::Kind::tensor);
        t->storage = storage;
        t->dtype = storage->dtype;
        t->i = offset->i;
        t->sizes = ints(args->items[2], "a tensor's sizes");
        t->strides = ints(args->items[3], "a tensor's strides");
        if (t->sizes.size() != t->strides.size())
            fail("a tensor has " + std::to_string(t->sizes.size()) + " sizes but " +
                 std::to_string(t->strides.size()) + " strides");
        return t;
    }

    Value* call(const Value* fn, const Value* args) {
        want(fn->kind == Value::Kind::global, "the callee of a call", fn, "a class or function");
        want(args->kind == Value::Kind::tuple, "the arguments of `" + fn->s + "`", args, "a tuple");
        const std::string& name = fn->s;
        if (name == "collections.OrderedDict") {
            Value* d = make(Value::Kind::dict);
            if (!args->items.empty()) fail("OrderedDict is called with arguments");
            return d;
        }
        if (name == "torch._utils._rebuild_tensor_v2" || name == "torch._utils._rebuild_tensor")
            return rebuild_tensor(args);
        if (name == "torch._utils._rebuild_parameter" ||
            name == "torch._utils._rebuild_parameter_with_state") {
            if (args->items.empty() || args->items[0]->kind != Value::Kind::tensor)
                fail("a parameter is rebuilt from something other than a tensor");
            return args->items[0];
        }
        if (name == "torch._tensor._rebuild_from_type_v2") {
            if (args->items.size() < 3) fail("_rebuild_from_type_v2 has too few arguments");
            const Value* type = args->items[1];
            want(type->kind == Value::Kind::global, "a tensor's type", type, "a class");
            if (type->s != "torch.Tensor" && type->s != "torch.nn.parameter.Parameter")
                fail("a tensor of type `" + type->s + "`");
            // PyTorch wraps one rebuild function; a wrapper of a wrapper would only recurse.
            const Value* inner = args->items[0];
            if (inner->kind == Value::Kind::global && inner->s == name)
                fail("_rebuild_from_type_v2 wraps itself");
            return call(inner, args->items[2]);
        }
        fail("the file calls `" + name + "`, which does not make a tensor or a dict");
    }

    // ('storage', type, key, location, numel) -> a storage.
    Value* persistent(const Value* pid) {
        want(pid->kind == Value::Kind::tuple, "a persistent id", pid, "a tuple");
        if (pid->items.size() != 5 || pid->items[0]->kind != Value::Kind::string ||
            pid->items[0]->s != "storage")
            fail("a persistent id that is not ('storage', type, key, location, numel)");
        const Value* type = pid->items[1];
        want(type->kind == Value::Kind::global, "a storage's type", type, "a class");
        auto dt = storage_types().find(type->s);
        if (dt == storage_types().end()) fail("a storage of type `" + type->s + "`");
        const Value* key = pid->items[2];
        want(key->kind == Value::Kind::string, "a storage's key", key, "a str");
        const Value* numel = pid->items[4];
        want(numel->kind == Value::Kind::integer, "a storage's size", numel, "an int");
        if (numel->i < 0) fail("a storage has a negative size");
        Value* s = make(Value::Kind::storage);
        s->dtype = dt->second;
        s->s = key->s;
        s->i = numel->i;
        return s;
    }

    void set_item(Value* dict, Value* key, Value* value) {
        want(dict->kind == Value::Kind::dict, "the target of a dict update", dict, "a dict");
        if (key->kind == Value::Kind::string) {
            auto [it, fresh] = dict->index.emplace(key->s, dict->entries.size());
            if (!fresh) {
                dict->entries[it->second].second = value; // a key set again: the last wins
                return;
            }
        }
        dict->entries.emplace_back(key, value);
    }

    Value* execute() {
        for (;;) {
            op_at_ = pos_;
            const uint8_t op = *take(1);
            switch (op) {
            case 0x80: { // PROTO
                const uint64_t v = uint_arg(1);
                if (v < 2 || v > 5) fail("pickle protocol " + std::to_string(v));
                break;
            }
            case 0x95: take(8); break; // FRAME: a hint for buffered readers
            case '.': {                // STOP
                if (!marks_.empty() || stack_.size() != 1)
                    fail("the program stops with " + std::to_string(stack_.size()) +
                         " values on the stack");
                return stack_.back();
            }
            case '(': marks_.push_back(stack_.size()); break;
            case ')': push(tuple({})); break;
            case ']': push(make(Value::Kind::list)); break;
            case '}': push(make(Value::Kind::dict)); break;
            case 't': push(tuple(pop_to_mark())); break;
            case 0x85:
            case 0x86:
            case 0x87: {
                std::vector<Value*> items(op - 0x84);
                for (size_t i = items.size(); i-- > 0;) items[i] = pop();
                push(tuple(std::move(items)));
                break;
            }
            case 'N': push(make(Value::Kind::none)); break;
            case 0x88:
            case 0x89: {
                Value* b = make(Value::Kind::boolean);
                b->i = op == 0x88;
                push(b);
                break;
            }
            case 'J': push(integer(static_cast<int32_t>(uint_arg(4)))); break;
            case 'K': push(integer(static_cast<int64_t>(uint_arg(1)))); break;
            case 'M': push(integer(static_cast<int64_t>(uint_arg(2)))); break;
            case 0x8a: { // LONG1: n little-endian two's-complement bytes
                const uint64_t n = uint_arg(1);
                if (n > 8) fail("an integer of " + std::to_string(n) + " bytes");
                uint64_t v = n ? le(take(n), static_cast<int>(n)) : 0;
                if (n && n < 8 && (v >> (8 * n - 1)) & 1) v |= ~uint64_t{0} << (8 * n);
                push(integer(static_cast<int64_t>(v)));
                break;
            }
            case 'G': { // BINFLOAT: big-endian double
                const uint8_t* b = take(8);
                uint64_t bits = 0;
                for (int i = 0; i < 8; ++i) bits = (bits << 8) | b[i];
                Value* f = make(Value::Kind::floating);
                std::memcpy(&f->f, &bits, 8);
                push(f);
                break;
            }
            case 'X': push(string(Value::Kind::string, uint_arg(4))); break;
            case 0x8c: push(string(Value::Kind::string, uint_arg(1))); break;
            case 0x8d: push(string(Value::Kind::string, uint_arg(8))); break;
            case 'B': push(string(Value::Kind::bytes, uint_arg(4))); break;
            case 'C': push(string(Value::Kind::bytes, uint_arg(1))); break;
            case 0x8e: push(string(Value::Kind::bytes, uint_arg(8))); break;
            case 'q': memo_put(uint_arg(1)); break;
            case 'r': memo_put(uint_arg(4)); break;
            case 0x94: memo_put(memo_.size()); break;
            case 'h': push(memo_get(uint_arg(1))); break;
            case 'j': push(memo_get(uint_arg(4))); break;
            case 'c': {
                std::string module = line();
                std::string name = line();
                push(global(module, name));
                break;
            }
            case 0x93: { // STACK_GLOBAL
                Value* name = pop();
                Value* module = pop();
                if (name->kind != Value::Kind::string || module->kind != Value::Kind::string)
                    fail("a global named by values that are not strings");
                push(global(module->s, name->s));
                break;
            }
            case 'R': {
                Value* args = pop();
                Value* fn = pop();
                push(call(fn, args));
                break;
            }
            case 'Q': push(persistent(pop())); break;
            case 'b': { // BUILD: the state of an object; a state dict's is its `_metadata`
                pop();
                Value* obj = top();
                if (obj->kind != Value::Kind::dict && obj->kind != Value::Kind::tensor)
                    fail("the program sets the state of " + std::string(kind_name(obj->kind)));
                break;
            }
            case 's': {
                Value* value = pop();
                Value* key = pop();
                set_item(top(), key, value);
                break;
            }
            case 'u': {
                std::vector<Value*> items = pop_to_mark();
                if (items.size() % 2) fail("SETITEMS with an odd number of values");
                Value* dict = top();
                for (size_t i = 0; i < items.size(); i += 2) set_item(dict, items[i], items[i + 1]);
                break;
            }
            case 'a': {
                Value* value = pop();
                Value* list = top();
                want(list->kind == Value::Kind::list, "the target of an append", list, "a list");
                list->items.push_back(value);
                break;
            }
            case 'e': {
                std::vector<Value*> items = pop_to_mark();
                Value* list = top();
                want(list->kind == Value::Kind::list, "the target of an append", list, "a list");
                list->items.insert(list->items.end(), items.begin(), items.end());
                break;
            }
            default: {
                static const char* hex = "0123456789abcdef";
                fail(std::string("pickle instruction 0x") + hex[op >> 4] + hex[op & 15] +
                     " is not one a state dict needs");
            }
            }
        }
    }

    const std::vector<uint8_t>& p_;
    uint64_t pos_ = 0, op_at_ = 0;
    std::vector<std::unique_ptr<Value>> arena_;
    std::vector<Value*> stack_;
    std::vector<size_t> marks_;
    std::unordered_map<uint64_t, Value*> memo_;
};

constexpr uint64_t kMaxPickleBytes = 64ull << 20;

// ---- Tensors ----------------------------------------------------------------------------------

// Copies the elements `t` views out of `storage` (its bytes) in row-major order.
std::string gather(const Value& t, const std::vector<uint8_t>& storage, TensorRecord& out) {
    const uint64_t elem = dtype_bytes(t.dtype);
    const auto storage_numel = static_cast<uint64_t>(t.storage->i);
    // Divided, not multiplied: a huge element count must not wrap around to the bytes there are.
    if (storage.size() % elem || storage.size() / elem != storage_numel)
        return "its storage `" + t.storage->s + "` holds " + std::to_string(storage.size()) +
               " bytes, not the " + std::to_string(storage_numel) + " elements of " +
               std::to_string(elem) + " bytes its header promises";
    // The element count, and the last element the view reaches, without overflow.
    uint64_t numel = 1, last = static_cast<uint64_t>(t.i);
    bool overflow = false;
    for (size_t d = 0; d < t.sizes.size(); ++d) {
        const auto n = static_cast<uint64_t>(t.sizes[d]);
        uint64_t reach = 0;
        overflow |= __builtin_mul_overflow(numel, n, &numel);
        if (n)
            overflow |= __builtin_mul_overflow(n - 1, static_cast<uint64_t>(t.strides[d]), &reach);
        overflow |= __builtin_add_overflow(last, reach, &last);
    }
    out.dtype = t.dtype;
    out.shape = t.sizes;
    if (overflow) return "its shape, strides and offset overflow";
    if (numel == 0) return {};
    if (last >= storage_numel)
        return "it reaches element " + std::to_string(last) + " of a storage of " +
               std::to_string(storage_numel);
    if (numel > storage_numel)
        return "it has more elements than its storage (an expanded view); save a contiguous "
               "copy (.contiguous()) instead";
    out.bytes.assign(numel * elem, 0);
    bool contiguous = true;
    uint64_t expect = 1;
    for (size_t d = t.sizes.size(); d-- > 0;) {
        if (t.sizes[d] != 1 && static_cast<uint64_t>(t.strides[d]) != expect) contiguous = false;
        expect *= static_cast<uint64_t>(t.sizes[d]);
    }
    if (contiguous) {
        std::memcpy(out.bytes.data(), storage.data() + static_cast<uint64_t>(t.i) * elem,
                    numel * elem);
        return {};
    }
    std::vector<int64_t> index(t.sizes.size(), 0);
    for (uint64_t k = 0; k < numel; ++k) {
        uint64_t src = static_cast<uint64_t>(t.i);
        for (size_t d = 0; d < index.size(); ++d)
            src += static_cast<uint64_t>(index[d]) * static_cast<uint64_t>(t.strides[d]);
        std::memcpy(out.bytes.data() + k * elem, storage.data() + src * elem, elem);
        for (size_t d = index.size(); d-- > 0;) {
            if (++index[d] < t.sizes[d]) break;
            index[d] = 0;
        }
    }
    return {};
}

std::string read_all(const std::string& path, SafetensorsFile& out) {
    Zip zip;
    if (std::string e = zip.open(path); !e.empty()) return e;
    // The pickle sits at NAME/data.pkl, with the storages beside it under NAME/data/.
    std::string prefix;
    int found = 0;
    for (const auto& [name, entry] : zip.entries()) {
        const size_t slash = name.find('/');
        if (slash != std::string::npos && name.substr(slash) == "/data.pkl") {
            prefix = name.substr(0, slash + 1);
            ++found;
        }
    }
    if (found != 1)
        return found ? "the archive holds more than one data.pkl"
                     : "the archive holds no data.pkl: it is not a torch.save file";
    std::vector<uint8_t> bytes;
    if (zip.find(prefix + "byteorder")) {
        if (std::string e = zip.read(prefix + "byteorder", bytes); !e.empty()) return e;
        if (std::string(bytes.begin(), bytes.end()) != "little")
            return "its byte order is `" + std::string(bytes.begin(), bytes.end()) +
                   "`; only little-endian files are read";
    }
    // A state dict's pickle is about a hundred bytes a tensor; the machine's values take a
    // hundred times their bytes, so a pickle is held to what a real one could need.
    if (const ZipEntry* pkl = zip.find(prefix + "data.pkl"); pkl->size > kMaxPickleBytes)
        return "its data.pkl has " + std::to_string(pkl->size) +
               " bytes, more than a state dict's pickle needs (" + std::to_string(kMaxPickleBytes) +
               ")";
    std::vector<uint8_t> program;
    if (std::string e = zip.read(prefix + "data.pkl", program); !e.empty()) return e;
    Unpickler machine(program);
    const Value* root = nullptr;
    if (std::string e = machine.run(root); !e.empty()) return e;
    if (root->kind != Value::Kind::dict)
        return "it holds " + std::string(kind_name(root->kind)) +
               ", not a dict of tensors (a state dict)";
    auto holds_tensors = [](const Value* d) {
        for (const auto& [k, v] : d->entries)
            if (v->kind == Value::Kind::tensor) return true;
        return false;
    };
    const Value* dict = root;
    if (!holds_tensors(dict))
        for (const auto& [k, v] : root->entries)
            if (k->kind == Value::Kind::string &&
                (k->s == "state_dict" || k->s == "model" || k->s == "module") &&
                v->kind == Value::Kind::dict && holds_tensors(v)) {
                dict = v;
                break;
            }
    if (!holds_tensors(dict))
        return "it holds no tensors: it is not a state dict (torch.save(model.state_dict(), ...))";
    // Each storage is read once and dropped after the last tensor that views it. What the
    // tensors copy out is held to a few times the file (tied weights view one storage twice).
    std::map<std::string, std::vector<uint8_t>> storages;
    std::map<std::string, size_t> uses;
    for (const auto& [key, value] : dict->entries)
        if (value->kind == Value::Kind::tensor) ++uses[value->storage->s];
    uint64_t copied = 0;
    const uint64_t copy_limit = 4 * zip.file_size() + (uint64_t{1} << 20);
    for (const auto& [key, value] : dict->entries) {
        if (value->kind != Value::Kind::tensor) continue;
        if (key->kind != Value::Kind::string)
            return "a tensor's key is " + std::string(kind_name(key->kind)) + ", not a name";
        auto it = storages.find(value->storage->s);
        if (it == storages.end()) {
            std::vector<uint8_t> data;
            if (std::string e = zip.read(prefix + "data/" + value->storage->s, data); !e.empty())
                return "tensor `" + key->s + "`: " + e;
            it = storages.emplace(value->storage->s, std::move(data)).first;
        }
        TensorRecord record;
        record.name = key->s;
        if (std::string e = gather(*value, it->second, record); !e.empty())
            return "tensor `" + key->s + "`: " + e;
        copied += record.bytes.size();
        if (copied > copy_limit)
            return "its tensors copy out " + std::to_string(copied) +
                   " bytes or more, several times the file's size: views that repeat one "
                   "storage over and over";
        if (--uses[value->storage->s] == 0) storages.erase(it);
        out.tensors.push_back(std::move(record));
    }
    return {};
}

} // namespace

std::string read_torch_checkpoint(const std::string& path, SafetensorsFile& out) {
    out = SafetensorsFile{};
    std::string e;
    try {
        e = read_all(path, out);
    } catch (const std::bad_alloc&) {
        e = "it needs more memory than there is";
    }
    if (e.empty()) return {};
    out = SafetensorsFile{};
    return "`" + path + "`: " + e;
}

} // namespace dist::models
