// train.cpp: the embedding API's back half: training through a training session (as `dist run`
// does, in this process or as one of a job's), evaluation, and generation. The weights a run ends
// with are gathered into one whole model that stays with the Script for evaluate() and generate().
#include "embed/internal.hpp"

#include "actors/plan/lower.hpp"
#include "actors/runtime/generate.hpp"
#include "actors/runtime/session.hpp"
#include "models/checkpoint.hpp"
#include "models/trainer.hpp"

#include <cmath>
#include <exception>
#include <stdexcept>

namespace fs = std::filesystem;

namespace dist {

namespace {

StepInfo to_info(const runtime::SessionStep& step) {
    const models::StepMetrics& m = step.metrics;
    StepInfo s;
    s.step = m.step;
    s.loss = m.loss;
    s.lr = m.lr;
    s.grad_norm = m.grad_norm;
    s.tokens = m.tokens;
    s.tokens_per_s = m.tokens_per_s;
    s.step_time_s = m.step_time_s;
    s.bubble = step.bubble;
    s.skipped = !step.nonfinite.empty();
    s.skipped_steps = step.skipped_steps;
    s.evaluated = step.eval_loss.has_value();
    s.eval_loss = step.eval_loss.value_or(0.0);
    return s;
}

// The same model (shapes and names), so weights trained with one serve the other.
bool same_model(const ModelSpec& a, const ModelSpec& b) {
    return a.template_name == b.template_name && a.vocab == b.vocab && a.context == b.context &&
           a.parameters == b.parameters;
}

} // namespace

namespace embed {

std::string load_model(const Program& p, const std::string& dir,
                       std::unique_ptr<models::Model>& out) {
    auto model = std::make_unique<models::Model>(p.model, static_cast<uint64_t>(p.train.seed),
                                                 Recompute::none, nullptr, p.train.precision);
    std::string error = models::load_weights(dir, *model);
    if (error.empty()) out = std::move(model);
    return error;
}

} // namespace embed

Result<TrainSummary> Script::train(const TrainOptions& options) {
    return embed::guarded([&]() -> Result<TrainSummary> {
        lang::CheckResult checked = impl_->run_check();
        if (!checked.ok()) return embed::check_failed(checked);
        const Program& p = *checked.program;
        plan::PlanResult planned = plan::lower(p);
        if (!planned.ok()) return Status::error(plan::render_errors(impl_->path, planned.errors));
        runtime::SessionOptions so;
        so.resume = options.resume_from;
        so.load = options.load_from;
        so.save_dir = options.checkpoint_dir;
        so.metrics_path = options.metrics_path;
        so.join_launch = options.join_launch;
        so.keep_weights = true;
        so.identity = impl_->text;
        for (const auto& o : impl_->overrides) so.identity += "\n--set " + o;
        if (options.on_step)
            so.on_step = [&](const runtime::SessionStep& s) { return options.on_step(to_info(s)); };
        runtime::Session session(p, *planned.graph, so);
        runtime::SessionError e = session.open();
        if (e.message.empty()) e = session.run();
        if (!e.message.empty()) return Status::error(e.message);
        TrainSummary summary;
        summary.first_step = session.first_step() + 1;
        if (const runtime::SessionStep* last = session.last()) {
            summary.last_step = last->metrics.step;
            summary.final_loss = last->metrics.loss;
        }
        summary.stopped = session.stopped();
        summary.checkpoint_dir = session.saved_dir();
        if (std::unique_ptr<models::Model> w = session.take_weights()) {
            impl_->trained_program = std::make_unique<Program>(p);
            impl_->trained = std::move(w);
        }
        return summary;
    });
}

Result<EvalFigures> Script::evaluate(const std::string& data_file, const std::string& weights) {
    return embed::guarded([&]() -> Result<EvalFigures> {
        lang::CheckResult checked = impl_->run_check();
        if (!checked.ok()) return embed::check_failed(checked);
        const Program& p = *checked.program;
        std::unique_ptr<models::Model> loaded;
        models::Model* model = nullptr;
        if (!weights.empty()) {
            std::string error = embed::load_model(p, weights, loaded);
            if (!error.empty()) return Status::error(error);
            model = loaded.get();
        } else if (impl_->trained) {
            model = impl_->trained.get();
        } else {
            return Status::error("no weights to evaluate: train() first or give a checkpoint "
                                 "folder");
        }
        DataSpec spec;
        spec.path = data_file;
        spec.format =
            fs::path(data_file).extension() == ".bin" ? DataFormat::tokens : DataFormat::text;
        models::TokenData data;
        std::string error = models::load_data(spec, model->spec(), data);
        if (!error.empty()) return Status::error(error);
        if (data.eval_windows(model->spec().context) == 0)
            return Status::error("`" + data_file + "` is shorter than one window of " +
                                 std::to_string(model->spec().context + 1) + " tokens");
        models::EvalResult r = models::evaluate(*model, data);
        EvalFigures f;
        f.loss = r.loss;
        f.tokens = r.tokens;
        f.perplexity = std::exp(r.loss);
        return f;
    });
}

Result<std::vector<std::string>> Script::generate(const std::vector<std::string>& prompts,
                                                  const GenerateOptions& options) {
    return embed::guarded([&]() -> Result<std::vector<std::string>> {
        try {
            lang::CheckResult checked = impl_->run_check();
            if (!checked.ok()) return embed::check_failed(checked);
            const Program* p = &*checked.program;
            std::unique_ptr<models::Model> loaded;
            const models::Model* model = nullptr;
            if (!options.weights.empty()) {
                std::string error = embed::load_model(*p, options.weights, loaded);
                if (!error.empty()) return Status::error(error);
                model = loaded.get();
            } else if (impl_->trained) {
                model = impl_->trained.get();
                // Changed overrides may describe another model: then the trained one's program.
                if (!same_model(p->model, impl_->trained_program->model))
                    p = impl_->trained_program.get();
            } else {
                return Status::error("no weights to generate with: train() first or give "
                                     "GenerateOptions::weights");
            }
            if (p->model.vocab != 256)
                return Status::error("prompts are read as bytes, which needs a vocabulary of 256; "
                                     "the model has " +
                                     std::to_string(p->model.vocab));
            if (prompts.empty()) return std::vector<std::string>{};
            plan::PlanResult planned = plan::lower(*p);
            if (!planned.ok())
                return Status::error(plan::render_errors(impl_->path, planned.errors));
            GenerateSpec gen = p->generate;
            if (options.temperature >= 0) gen.temperature = options.temperature;
            if (options.top_k >= 0) gen.top_k = options.top_k;
            if (options.max_tokens >= 0) gen.max_tokens = options.max_tokens;
            std::vector<std::vector<int32_t>> tokens;
            for (const auto& s : prompts) {
                std::vector<int32_t> t;
                for (char c : s) t.push_back(static_cast<int32_t>(static_cast<unsigned char>(c)));
                tokens.push_back(std::move(t));
            }
            runtime::Generator generator(*p, *planned.graph, *model);
            std::function<void(size_t, int32_t)> on_token;
            if (options.on_text)
                on_token = [&](size_t row, int32_t t) {
                    options.on_text(row, std::string(1, static_cast<char>(t)));
                };
            auto out =
                generator.generate(tokens, gen, static_cast<uint64_t>(p->train.seed), on_token);
            std::vector<std::string> texts;
            for (const auto& t : out) {
                std::string s;
                for (int32_t c : t) s.push_back(static_cast<char>(c));
                texts.push_back(std::move(s));
            }
            return texts;
        } catch (const std::invalid_argument& e) {
            return Status::error(e.what()); // a prompt the model cannot take
        }
    });
}

} // namespace dist
