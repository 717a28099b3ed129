// trainer.cpp: the single-device training loop.
#include "models/trainer.hpp"

#include "kernels/cpu/ops.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

namespace dist::models {

double learning_rate(const TrainSpec& t, int64_t step) {
    const LrScheduleSpec& s = t.lr_schedule;
    double peak = t.optimizer.lr;
    if (step < s.warmup)
        return peak * static_cast<double>(step + 1) / static_cast<double>(s.warmup);
    if (s.kind == LrScheduleKind::constant) return peak;
    int64_t span = std::max<int64_t>(1, t.steps - 1 - s.warmup);
    double progress =
        std::min(1.0, static_cast<double>(step - s.warmup) / static_cast<double>(span));
    double shape =
        s.kind == LrScheduleKind::cosine ? 0.5 * (1.0 + std::cos(M_PI * progress)) : 1.0 - progress;
    return s.min_lr + (peak - s.min_lr) * shape;
}

std::string load_data(const DataSpec& data, const ModelSpec& model, TokenData& out) {
    int64_t need = model.context + 1;
    switch (data.format) {
    case DataFormat::none: return "the script names no training data (`train.data`)";
    case DataFormat::text:
        if (model.vocab < 256)
            return "text is read as bytes (256 tokens), but the model's vocabulary is " +
                   std::to_string(model.vocab);
        return TokenData::load_text(data.path, need, out);
    case DataFormat::tokens:
        return TokenData::load_bin(data.path, static_cast<int32_t>(model.vocab), need, out);
    case DataFormat::synthetic: {
        // Random tokens, enough for any window: a stand-in for planning-only scripts.
        std::vector<uint16_t> tokens(static_cast<size_t>(std::max<int64_t>(need * 64, 1 << 16)));
        for (size_t i = 0; i < tokens.size(); ++i)
            tokens[i] =
                static_cast<uint16_t>(hash64(0x5eed, i, 0) %
                                      static_cast<uint64_t>(std::min<int64_t>(model.vocab, 65536)));
        return TokenData::from_tokens(tokens, out);
    }
    }
    return "unknown data format";
}

std::string metrics_json(const StepMetrics& m) {
    nlohmann::json j = {{"step", m.step},
                        {"loss", m.loss},
                        {"lr", m.lr},
                        {"grad_norm", m.grad_norm},
                        {"tokens", m.tokens},
                        {"step_time_s", m.step_time_s},
                        {"tokens_per_s", m.tokens_per_s}};
    if (!m.experts.empty()) {
        // Tokens per expert (copies admitted, summed over the layers), the copies dropped at
        // capacity, and the auxiliary loss's mean over the layers and microbatches (the value
        // its coefficient adds to the objective, per layer).
        j["expert_load"] = m.experts.load;
        j["dropped_tokens"] = m.experts.dropped;
        j["routed_tokens"] = m.experts.routed;
        j["aux_loss"] = m.experts.aux_terms > 0
                            ? m.experts.aux_loss / static_cast<double>(m.experts.aux_terms)
                            : 0.0;
        // max / mean of the load: 1 is perfectly balanced.
        double total = 0.0, most = 0.0;
        for (int64_t l : m.experts.load) {
            total += static_cast<double>(l);
            most = std::max(most, static_cast<double>(l));
        }
        j["expert_imbalance"] =
            total > 0 ? most * static_cast<double>(m.experts.load.size()) / total : 0.0;
    }
    return j.dump();
}

double optimizer_step(const TrainSpec& t, int64_t step, double norm,
                      const std::vector<Parameter*>& params, kernels::Backend& device) {
    // Each parameter's elements that its moments cover: all, or this rank's ZeRO share.
    if (t.clip > 0 && norm > t.clip)
        for (Parameter* p : params)
            if (p->m.numel() > 0) device.scale(p->state_grad(), p->m.numel(), t.clip / norm);
    const double lr = learning_rate(t, step);
    for (Parameter* p : params)
        if (p->m.numel() > 0)
            device.adamw_step(p->state_grad(), p->m.numel(), lr, t.optimizer.beta1,
                              t.optimizer.beta2, t.optimizer.eps,
                              p->decay ? t.optimizer.weight_decay : 0.0, step + 1,
                              p->owned.defined() ? p->owned.data<float>()
                                                 : p->value.data<float>() + p->state_begin,
                              p->m.data<float>(), p->v.data<float>());
    return lr;
}

std::string train(const Program& program, Model& model, const TokenData& data, int64_t first_step,
                  const std::function<bool(const StepMetrics&)>& on_step) {
    namespace ops = kernels::cpu;
    const TrainSpec& t = program.train;
    const int64_t B = t.batch, T = program.model.context;
    const int64_t m = program.schedule.microbatches, mb_rows = B / m;
    const int64_t last = t.stop_after > 0 ? t.stop_after : t.steps;
    if (B % m != 0) return "batch does not split into microbatches";
    kernels::Tensor inputs({B, T}, kernels::DType::i32), targets({B, T}, kernels::DType::i32);
    std::vector<kernels::Tensor> mb_in, mb_tg;
    for (int64_t i = 0; i < m; ++i) {
        mb_in.emplace_back(std::vector<int64_t>{mb_rows, T}, kernels::DType::i32);
        mb_tg.emplace_back(std::vector<int64_t>{mb_rows, T}, kernels::DType::i32);
    }
    std::vector<Parameter*> params;
    for (auto& p : model.params().all()) params.push_back(&p);
    for (int64_t step = first_step; step < last; ++step) {
        auto start = std::chrono::steady_clock::now();
        data.batch(static_cast<uint64_t>(t.seed), step, B, T, 0, 1, inputs.data<int32_t>(),
                   targets.data<int32_t>());
        model.params().zero_grads();
        double loss = 0.0;
        for (int64_t i = 0; i < m; ++i) {
            size_t bytes = static_cast<size_t>(mb_rows * T) * sizeof(int32_t);
            std::memcpy(mb_in[static_cast<size_t>(i)].raw(),
                        inputs.data<int32_t>() + i * mb_rows * T, bytes);
            std::memcpy(mb_tg[static_cast<size_t>(i)].raw(),
                        targets.data<int32_t>() + i * mb_rows * T, bytes);
            loss += model.forward(i, mb_in[static_cast<size_t>(i)], mb_tg[static_cast<size_t>(i)],
                                  1.0 / static_cast<double>(m)) /
                    static_cast<double>(m);
            model.backward(i, 1.0 / static_cast<double>(m));
        }
        double sq = 0.0;
        for (auto& p : model.params().all())
            sq += ops::sum_squares(p.grad.data<float>(), p.grad.numel());
        double norm = std::sqrt(sq);
        // The same guard as the distributed runtime's: no weight takes a non-finite step.
        const char* bad = !std::isfinite(loss)   ? "loss"
                          : !std::isfinite(norm) ? "gradient norm"
                                                 : "";
        if (*bad && t.on_nonfinite == NonFinitePolicy::stop)
            return "step " + std::to_string(step + 1) + ": the " + bad + " is non-finite";
        double lr = *bad ? learning_rate(t, step) : optimizer_step(t, step, norm, params);
        double secs =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        StepMetrics sm{step + 1,
                       loss,
                       lr,
                       norm,
                       B * T,
                       secs,
                       secs > 0 ? static_cast<double>(B * T) / secs : 0.0,
                       model.take_expert_stats()};
        if (on_step && !on_step(sm)) break;
    }
    return {};
}

EvalResult evaluate(Model& model, const TokenData& data, int64_t max_windows) {
    const int64_t T = model.spec().context;
    const int64_t windows =
        max_windows >= 0 ? std::min(max_windows, data.eval_windows(T)) : data.eval_windows(T);
    const int64_t group = 8; // windows per forward
    EvalResult r;
    double sum = 0.0;
    for (int64_t w0 = 0; w0 < windows; w0 += group) {
        int64_t n = std::min(group, windows - w0);
        kernels::Tensor in({n, T}, kernels::DType::i32), tg({n, T}, kernels::DType::i32);
        for (int64_t i = 0; i < n; ++i)
            data.eval_window(w0 + i, T, in.data<int32_t>() + i * T, tg.data<int32_t>() + i * T);
        sum += model.loss(in, tg) * static_cast<double>(n * T);
        r.tokens += n * T;
    }
    r.loss = r.tokens > 0 ? sum / static_cast<double>(r.tokens) : 0.0;
    return r;
}

int32_t choose_token(const float* z, int64_t V, const GenerateSpec& gen, uint64_t seed,
                     uint64_t position, uint64_t row) {
    if (gen.temperature <= 0.0) return static_cast<int32_t>(std::max_element(z, z + V) - z);
    // Keep the top_k logits, softmax at the temperature, draw from (seed, position, row).
    std::vector<int32_t> order(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) order[static_cast<size_t>(i)] = static_cast<int32_t>(i);
    int64_t keep = gen.top_k > 0 ? std::min<int64_t>(gen.top_k, V) : V;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(),
                      [&](int32_t a, int32_t b) { return z[a] > z[b]; });
    std::vector<double> probs(static_cast<size_t>(keep));
    double mx = z[order[0]], total = 0.0;
    for (int64_t i = 0; i < keep; ++i) {
        double p = std::exp((z[order[static_cast<size_t>(i)]] - mx) / gen.temperature);
        probs[static_cast<size_t>(i)] = p;
        total += p;
    }
    double u = static_cast<double>(hash64(seed, position, 0x9e37 + row) >> 11) * 0x1.0p-53 * total;
    for (int64_t i = 0; i < keep; ++i) {
        u -= probs[static_cast<size_t>(i)];
        if (u <= 0) return order[static_cast<size_t>(i)];
    }
    return order[static_cast<size_t>(keep - 1)];
}

void sample(Model& model, const GenerateSpec& gen, uint64_t seed, std::vector<int32_t>& tokens) {
    const int64_t T = model.spec().context, V = model.spec().vocab;
    for (int64_t k = 0; k < gen.max_tokens; ++k) {
        int64_t n = std::min<int64_t>(T, static_cast<int64_t>(tokens.size()));
        kernels::Tensor in({1, n}, kernels::DType::i32);
        std::copy(tokens.end() - n, tokens.end(), in.data<int32_t>());
        kernels::Tensor logits = model.logits(in);
        tokens.push_back(
            choose_token(logits.data<float>() + (n - 1) * V, V, gen, seed, tokens.size(), 0));
    }
}

} // namespace dist::models
