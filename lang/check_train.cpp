// check_train.cpp: the `train` block (data, batch, optimizer, lr schedule, checkpoints,
// evaluation) and the `generate` block.
#include "lang/check_blocks.hpp"

namespace fs = std::filesystem;

namespace dist::lang {

bool BlockChecker::read_data(BlockReader& r, const std::string& name, DataSpec& out) {
    const Field* f = r.field(name);
    if (!f) return true;
    const Expr& e = *f->value;
    static const std::vector<std::string> sources_ = {"text", "tokens", "synthetic"};
    if (e.kind != ExprKind::call ||
        std::find(sources_.begin(), sources_.end(), e.text) == sources_.end()) {
        std::string best = e.kind == ExprKind::call ? closest_name(e.text, sources_) : "";
        diags.error(e.loc, "data is `text(\"FILE\")`, `tokens(\"FILE.bin\")` or `synthetic()`",
                    best.empty() ? "" : "did you mean `" + best + "`?");
        return false;
    }
    out.format = e.text == "text"     ? DataFormat::text
                 : e.text == "tokens" ? DataFormat::tokens
                                      : DataFormat::synthetic;
    if (out.format == DataFormat::synthetic) {
        if (!e.args.empty()) {
            diags.error(e.args[0].value->loc, "`synthetic()` takes no arguments");
            return false;
        }
        return true;
    }
    if (e.args.size() != 1 || !e.args[0].name.empty()) {
        diags.error(e.loc, "`" + e.text + "` takes one argument: the file's path");
        return false;
    }
    auto v = evaluate(*e.args[0].value, defs.globals, diags);
    if (!v) return false;
    if (v->type != Value::Type::string || v->s.empty()) {
        diags.error(e.args[0].value->loc, "the data file is a non-empty string");
        return false;
    }
    fs::path path(v->s);
    if (path.is_relative()) path = dir / path;
    out.path = path.lexically_normal().string();
    if (options.check_files) {
        std::error_code ec;
        if (!fs::exists(path, ec)) {
            diags.error(e.args[0].value->loc, "cannot find data file `" + v->s + "`",
                        v->s.find("fortunes") != std::string::npos
                            ? "Debian's `fortunes` package provides it: run `make deps`"
                            : "paths are relative to the script's folder");
            return false;
        }
        if (!fs::is_regular_file(path, ec)) {
            diags.error(e.args[0].value->loc, "data file `" + v->s + "` is not a regular file");
            return false;
        }
    }
    return true;
}

void BlockChecker::train(const Block* block) {
    BlockReader r(block, "train", defs.globals, diags);
    TrainSpec& t = p.train;
    if (!block) {
        if (!unknown_block)
            diags.error({file, 1, 1, 1}, "the script has no `train` block",
                        "add `train { batch: 8  steps: 100 }` at least");
        ok = false;
        return;
    }
    if (!read_data(r, "data", t.data)) ok = false;
    auto batch = r.integer("batch", 1, INT64_MAX / 2);
    batch_loc = r.loc_of("batch");
    auto steps = r.integer("steps", 1);
    auto stop = r.integer("stop_after", 1);
    t.seed = r.integer("seed", 0).value_or(1337);
    static const std::vector<std::string> precisions = {"f32", "bf16"};
    if (auto pr = r.choice("precision", precisions, "precision"))
        t.precision = pick<Precision>(precisions, *pr);
    t.clip = r.real("clip", 0.0, false).value_or(0.0);
    static const std::vector<std::string> policies = {"stop", "skip"};
    if (auto pol = r.choice("on_nonfinite", policies, "policy"))
        t.on_nonfinite = pick<NonFinitePolicy>(policies, *pol);

    BlockReader o(r.block("optimizer"), "train.optimizer", defs.globals, diags);
    o.choice("kind", {"adamw"}, "optimizer");
    t.optimizer.lr = o.real("lr", 0.0, true).value_or(t.optimizer.lr);
    if (const Field* betas = o.field("betas")) {
        auto bv = evaluate(*betas->value, defs.globals, diags);
        bool shape = bv && bv->type == Value::Type::tuple && bv->items.size() == 2 &&
                     bv->items[0].is_number() && bv->items[1].is_number();
        if (!shape || bv->items[0].as_real() < 0 || bv->items[0].as_real() >= 1 ||
            bv->items[1].as_real() < 0 || bv->items[1].as_real() >= 1) {
            if (bv)
                diags.error(betas->value->loc, "`betas` is two numbers in [0, 1), e.g. "
                                               "(0.9, 0.95)");
            ok = false;
        } else {
            t.optimizer.beta1 = bv->items[0].as_real();
            t.optimizer.beta2 = bv->items[1].as_real();
        }
    }
    t.optimizer.eps = o.real("eps", 0.0, true).value_or(t.optimizer.eps);
    t.optimizer.weight_decay = o.real("weight_decay", 0.0, false).value_or(0.0);
    o.finish();

    static const std::vector<std::string> lr_kinds = {"constant", "cosine", "linear"};
    BlockReader l(r.block("lr_schedule"), "train.lr_schedule", defs.globals, diags);
    if (auto k = l.choice("kind", lr_kinds, "lr schedule"))
        t.lr_schedule.kind = pick<LrScheduleKind>(lr_kinds, *k);
    auto warmup = l.integer("warmup", 0);
    t.lr_schedule.warmup = warmup.value_or(0);
    auto min_lr = l.real("min_lr", 0.0, false);
    t.lr_schedule.min_lr = min_lr.value_or(0.0);
    l.finish();

    BlockReader c(r.block("checkpoint"), "train.checkpoint", defs.globals, diags);
    t.checkpoint.every = c.integer("every", 1).value_or(0);
    if (auto d = c.choice("dtype", precisions, "dtype"))
        t.checkpoint.dtype = pick<Precision>(precisions, *d);
    auto ckdir = c.string("dir");
    if (ckdir) {
        if (ckdir->empty()) {
            diags.error(c.loc_of("dir"), "`train.checkpoint.dir` is empty");
            ok = false;
        } else {
            fs::path d(*ckdir);
            t.checkpoint.dir = (d.is_relative() ? dir / d : d).lexically_normal().string();
        }
    } else if (c.present() && !c.failed() && c.field("every")) {
        // `dtype` alone may go with `dist run --save`, which names the folder.
        diags.error(c.loc(), "`checkpoint` needs `dir`, the folder to save into");
        ok = false;
    }
    c.finish();

    BlockReader e(r.block("eval"), "train.eval", defs.globals, diags);
    t.eval.every = e.integer("every", 1).value_or(0);
    if (!read_data(e, "data", t.eval.data)) ok = false;
    t.eval.batches = e.integer("batches", 1).value_or(1);
    if (e.present() && !e.failed() && t.eval.data.format == DataFormat::none) {
        diags.error(e.loc(), "`eval` needs `data`");
        ok = false;
    }
    e.finish();
    r.finish();
    ok = ok && !r.failed() && !o.failed() && !l.failed() && !c.failed() && !e.failed();

    if (!batch) {
        if (!r.failed())
            diags.error(block->loc, "`train` needs `batch`, the global batch in sequences");
        ok = false;
    }
    if (!steps) {
        if (!r.failed()) diags.error(block->loc, "`train` needs `steps`");
        ok = false;
    }
    if (!batch || !steps) return;
    t.batch = *batch;
    t.steps = *steps;
    if (stop) {
        if (*stop > t.steps) {
            diags.error(r.loc_of("stop_after"), "`stop_after` " + std::to_string(*stop) +
                                                    " is past the last step " +
                                                    std::to_string(t.steps));
            ok = false;
        }
        t.stop_after = *stop;
    }
    if (warmup && *warmup > t.steps) {
        diags.error(l.loc_of("warmup"), "warm-up of " + std::to_string(*warmup) +
                                            " steps is longer than the run's " +
                                            std::to_string(t.steps));
        ok = false;
    }
    if (min_lr && *min_lr > t.optimizer.lr) {
        diags.error(l.loc_of("min_lr"),
                    "`min_lr` is above the peak `lr` " + Value::real(t.optimizer.lr).str());
        ok = false;
    }
}

void BlockChecker::generate(const Block* block) {
    BlockReader r(block, "generate", defs.globals, diags);
    GenerateSpec& g = p.generate;
    g.temperature = r.real("temperature", 0.0, false).value_or(1.0);
    g.top_k = r.integer("top_k", 0, model_ok ? p.model.vocab : INT64_MAX).value_or(0);
    // Generation may run past the context: it then conditions on the last `context` tokens.
    g.max_tokens = r.integer("max_tokens", 1, 1 << 20).value_or(256);
    r.finish();
    if (r.failed()) ok = false;
}

// Rules across blocks: tensor-parallel divisibility, the batch, the memory floor.
} // namespace dist::lang
