// executor.cpp: running one rank's action list.
#include "actors/runtime/executor.hpp"

#include "models/trainer.hpp"

#include <omp.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <ctime>
#include <deque>
#include <map>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>

namespace dist::runtime {

using kernels::Tensor;

std::string RankFailure::str() const {
    std::string s = "rank " + std::to_string(rank);
    if (!action.empty()) s += " in " + action;
    return s + ": " + cause;
}

namespace {

// Seconds on the host's monotonic clock, which every process of a host shares.
double seconds_of(std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// Seconds the calling thread has run on a core (its CPU clock).
double thread_cpu_seconds() {
    timespec ts{};
    if (::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0) return 0.0;
    return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

Tensor take(std::map<int32_t, Tensor>& m, int32_t mb, const char* what, int32_t stage) {
    auto it = m.find(mb);
    if (it == m.end())
        throw std::logic_error("stage " + std::to_string(stage) + " has no " + what +
                               " for microbatch " + std::to_string(mb) +
                               " (the plan runs an action before its input exists)");
    Tensor t = std::move(it->second);
    m.erase(it);
    return t;
}

// With bf16 a stage's outputs and input gradients hold bf16 values (the stage rounds them):
// they cross to the next stage as bf16, exactly and in half the bytes, as the simulator prices
// them; the receiver widens them to float again.
Tensor narrowed(const Tensor& t, kernels::Backend& device, bool bf16) {
    if (!bf16 || t.dtype() != kernels::DType::f32) return t;
    Tensor n = device.empty(t.shape(), kernels::DType::bf16);
    device.to_bf16(t.data<float>(), t.numel(), n.data<uint16_t>());
    return n;
}

Tensor widened(const Tensor& received, kernels::Backend& device) {
    Tensor t = device.here(received);
    if (t.dtype() != kernels::DType::bf16) return t;
    Tensor w = device.empty(t.shape());
    device.from_bf16(t.data<uint16_t>(), t.numel(), w.data<float>());
    return w;
}

// ZeRO: the elements [lo, hi) of a parameter's n local elements that data-parallel member d of
// `members` owns: its optimizer state, its reduced gradient (stage 2), its update.
std::pair<int64_t, int64_t> zero_share(int64_t n, int d, int members) {
    return {n * d / members, n * (d + 1) / members};
}

// A parameter's StateGroup: a routed expert's holders under ep, else the data-parallel group.
StateGroup state_group(const models::Parameter& p, const RankComms& comms, int32_t ep) {
    transport::Collectives* c = p.expert && ep > 1 ? comms.edp : comms.dp;
    if (!c) return {};
    return {c, c->size(), c->rank()};
}

// Parameters by the group that shares their state (state_group): indices `at` into the list,
// the data-parallel group's part first, then under ep the routed experts' holders'; with each
// member's count of packed share elements (zero_share) and the longest, to which every
// member's part is padded for one collective.
struct StatePart {
    std::vector<size_t> at;
    StateGroup group;
    std::vector<int64_t> counts;
    int64_t chunk = 0;
};

std::vector<StatePart> by_state_group(const std::vector<models::Parameter*>& params,
                                      const RankComms& comms, int32_t ep) {
    std::vector<StatePart> out;
    for (const bool expert : {false, true}) {
        StatePart part;
        for (size_t i = 0; i < params.size(); ++i)
            if ((params[i]->expert && ep > 1) == expert) {
                part.at.push_back(i);
                part.group = state_group(*params[i], comms, ep);
            }
        if (part.at.empty()) continue;
        part.counts.assign(static_cast<size_t>(part.group.members), 0);
        for (size_t i : part.at)
            for (int d = 0; d < part.group.members; ++d) {
                auto [lo, hi] = zero_share(params[i]->numel(), d, part.group.members);
                part.counts[static_cast<size_t>(d)] += hi - lo;
            }
        part.chunk = *std::max_element(part.counts.begin(), part.counts.end());
        out.push_back(std::move(part));
    }
    return out;
}

// The reduced gradient a step reads: this member's share under ZeRO 2 and 3, else the whole.
std::pair<float*, int64_t> reduced_gradient(models::Parameter& p) {
    if (p.grad_share.defined()) return {p.grad_share.data<float>(), p.grad_share.numel()};
    return {p.grad.data<float>(), p.grad.numel()};
}

// The name of the embedding a tied head shares, or "".
std::string tied_embedding(const ModelSpec& spec) {
    bool tied = false;
    for (const auto& item : spec.post)
        for (const auto& l : item.layers)
            if (l.kind == LayerKind::lm_head && l.tied) tied = true;
    if (!tied) return {};
    for (const auto& item : spec.pre)
        for (const auto& l : item.layers)
            if (l.kind == LayerKind::embedding) return l.name + ".weight";
    return {};
}

// A host number summed over `group`, a group that reduces the memory of the rank's device
// (`device`): it travels in a device buffer (NCCL and the host-staged groups read and write
// device memory only).
float summed_over(transport::Collectives& group, kernels::Backend& device, float value) {
    kernels::Tensor one({1});
    one.data<float>()[0] = value;
    kernels::Tensor there = device.here(one);
    group.all_reduce(there.data<float>(), 1, transport::ReduceOp::sum);
    return there.on_host().data<float>()[0];
}

} // namespace

// ----- per-stage state ------------------------------------------------------------------------

struct RankExecutor::StageState {
    plan::PlanStage info;
    models::Stage stage;
    // Per microbatch, within a step: the input activation (received or handed over by the
    // previous stage on this rank), the output for the next stage, the gradient of the output
    // and the gradient of the input for the previous stage.
    std::map<int32_t, Tensor> inputs, outputs, grad_in, grad_out;
    std::map<int32_t, std::vector<int64_t>> loss_shape;

    StageState(const plan::PlanStage& s, const Program& p, const RankComms& comms,
               kernels::Backend& device)
        : info(s),
          stage(p.model,
                models::StageSpan{s.first_block, s.first_block + s.blocks, s.embedding, s.head},
                static_cast<uint64_t>(p.train.seed), p.schedule.recompute, comms.tp, &device,
                p.mesh.sp, comms.cp, comms.ep, p.train.precision) {}

    void clear() {
        inputs.clear();
        outputs.clear();
        grad_in.clear();
        grad_out.clear();
        loss_shape.clear();
    }
};

// ----- the data-parallel gradient reduction, on its own thread --------------------------------

// Reduces gradient buckets in the order they are enqueued (the plan's order, the same on every
// member of the data-parallel group) and averages them over the group. A bucket is an equal
// share of a stage's gradients, flattened in parameter order. Under ZeRO 2 and 3 it runs the
// reduce-scatters of the gradients each unit's backward leaves (GradientScatterer) instead.
class RankExecutor::Reducer {
  public:
    /// With split_experts (expert parallelism), the plan's last expert_buckets buckets of a
    /// stage hold its routed experts' gradients, summed over the expert-data-parallel group
    /// (null: a group of one) and averaged over the whole data-parallel one, as every member of
    /// an expert group has added its tokens' share already; the other buckets hold the rest.
    Reducer(transport::Collectives* dp, std::map<int32_t, std::unique_ptr<StageState>>& stages,
            kernels::Backend& device)
        : dp_(dp), stages_(stages), device_(device), thread_([this] { loop(); }) {}
    ~Reducer() {
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }

    void split_experts(transport::Collectives* edp) {
        split_ = true;
        edp_ = edp;
    }

    /// REDUCE_GRAD, the rank's action `action`.
    void enqueue(int32_t stage, int32_t bucket, size_t action) {
        run([this, stage, bucket] { reduce(stage, bucket); }, action);
    }

    /// Queues any other collective of the group (ZeRO 3's gathers, ZeRO 2's reduce-scatters)
    /// behind those queued: every member queues them in one order, so the group runs them in
    /// one order. `action`: the plan action it is part of, for its timing. Returns a ticket
    /// for wait_for.
    uint64_t run(std::function<void()> task, size_t action) {
        std::lock_guard lock(mutex_);
        queue_.push_back({std::move(task), action});
        cv_.notify_all();
        return ++queued_;
    }

    /// The plan actions that the gathers and the reduce-scatters queued from now on are part
    /// of: those of the stage and microbatch computing (set on the rank's thread before each
    /// action, read there by the hooks).
    size_t gathering = 0, scattering = 0;

    /// The collectives run since the last call: (action, start, end) on the host's monotonic
    /// clock, seconds.
    std::vector<ActionTiming> take_ran() {
        std::lock_guard lock(mutex_);
        std::vector<ActionTiming> out;
        out.swap(ran_);
        return out;
    }

    /// Waits until the task of `ticket` (and every one before it) has run; rethrows a failure.
    void wait_for(uint64_t ticket) {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return done_ >= ticket || error_; });
        if (error_) std::rethrow_exception(error_);
    }

    /// Waits until every queued task has run; rethrows a failure of one (and clears it).
    void wait() {
        std::unique_lock lock(mutex_);
        cv_.wait(lock, [&] { return done_ == queued_ || error_; });
        if (error_) {
            auto e = error_;
            error_ = nullptr;
            std::rethrow_exception(e);
        }
    }

    /// ZeRO 2 and 3, on this thread: whole gradients of one microbatch (each parameter's
    /// `grads` beside it), reduce-scattered over each parameter's StateGroup (the data-parallel
    /// group, or a routed expert's holders), every member packing every member's shares in
    /// turn, each padded to the longest; this member's shares come back summed and are added to
    /// its grad_share averaged over the data-parallel group (every holder of an expert has
    /// added its tokens' share already). The whole gradients are freed after.
    void scatter(const std::vector<models::Parameter*>& params, const std::vector<Tensor>& grads,
                 const RankComms& comms, int32_t ep) {
        const float inv = 1.0f / static_cast<float>(dp_->size());
        for (const StatePart& part : by_state_group(params, comms, ep)) {
            const int members = part.group.members;
            if (!part.group.comms) { // their only holder: each whole gradient is the share
                for (size_t i : part.at) {
                    float* g = grads[i].data<float>();
                    float* into = params[i]->grad_share.data<float>();
                    const int64_t n = params[i]->numel();
                    device_.scale(g, n, inv);
                    device_.add(into, g, n, into);
                }
                continue;
            }
            if (part.chunk == 0) continue;
            const int64_t chunk = part.chunk;
            if (buffer_.numel() < chunk * members) buffer_ = device_.empty({chunk * members});
            if (share_.numel() < chunk) share_ = device_.empty({chunk});
            float* buffer = buffer_.data<float>();
            for (int d = 0; d < members; ++d) {
                int64_t at = d * chunk;
                for (size_t i : part.at) {
                    auto [lo, hi] = zero_share(params[i]->numel(), d, members);
                    device_.copy_block(grads[i].data<float>() + lo, hi - lo, buffer + at, hi - lo,
                                       1, hi - lo);
                    at += hi - lo;
                }
                if (at < (d + 1) * chunk) device_.fill(buffer + at, (d + 1) * chunk - at, 0.0f);
            }
            float* summed = share_.data<float>();
            part.group.comms->reduce_scatter(buffer, chunk, summed);
            device_.scale(summed, part.counts[static_cast<size_t>(part.group.me)], inv);
            int64_t at = 0;
            for (size_t i : part.at) {
                float* into = params[i]->grad_share.data<float>();
                const int64_t n = params[i]->grad_share.numel();
                device_.add(into, summed + at, n, into);
                at += n;
            }
        }
    }

  private:
    void loop() {
        // The copies and the scaling here are short: one thread, beside the rank's own
        // compute threads (OpenMP would start a team of its own here).
        omp_set_num_threads(1);
        std::unique_lock lock(mutex_);
        while (true) {
            cv_.wait(lock, [&] { return stop_ || (!queue_.empty() && !error_); });
            if (stop_) return;
            auto [task, action] = std::move(queue_.front());
            queue_.pop_front();
            lock.unlock();
            const auto began = std::chrono::steady_clock::now();
            try {
                task();
            } catch (...) {
                lock.lock();
                error_ = std::current_exception();
                done_ += queue_.size() + 1; // what is left will not run
                queue_.clear();
                cv_.notify_all();
                continue;
            }
            const double ended = seconds_of(std::chrono::steady_clock::now());
            lock.lock();
            ran_.push_back({action, seconds_of(began), ended, true});
            ++done_;
            cv_.notify_all();
        }
    }

    void reduce(int32_t stage, int32_t bucket) {
        StageState& s = *stages_.at(stage);
        auto& all = s.stage.params().all();
        auto k = static_cast<int64_t>(std::max<size_t>(1, s.info.buckets.size()));
        // The bucket's group and its share of which parameters.
        transport::Collectives* group = dp_;
        std::vector<models::Parameter*> params;
        if (split_) {
            const int64_t experts = s.info.expert_buckets, dense = k - experts;
            const bool expert = s.info.expert_bucket(bucket);
            if (expert) {
                group = edp_;
                bucket -= static_cast<int32_t>(dense);
                k = experts;
            } else {
                k = dense;
            }
            for (auto& p : all)
                if (p.expert == expert) params.push_back(&p);
        } else {
            for (auto& p : all) params.push_back(&p);
        }
        int64_t total = 0;
        for (const auto* p : params) total += p->numel();
        int64_t begin = total * bucket / k, end = total * (bucket + 1) / k;
        if (end == begin) return;
        if (buffer_.numel() != end - begin) buffer_ = device_.empty({end - begin});
        float* buffer = buffer_.data<float>();
        // Pack the bucket's range of the flattened gradients, reduce, unpack averaged.
        auto walk = [&](auto&& visit) {
            int64_t offset = 0;
            for (auto* p : params) {
                int64_t n = p->numel();
                int64_t lo = std::max(begin, offset), hi = std::min(end, offset + n);
                if (lo < hi) visit(p->grad.data<float>() + (lo - offset), lo - begin, hi - lo);
                offset += n;
            }
        };
        walk([&](float* g, int64_t at, int64_t n) {
            device_.copy_block(g, n, buffer + at, n, 1, n);
        });
        if (group) group->all_reduce(buffer, end - begin, transport::ReduceOp::sum);
        float inv = 1.0f / static_cast<float>(dp_->size());
        walk([&](float* g, int64_t at, int64_t n) { device_.copy_scaled(buffer + at, n, inv, g); });
    }

    transport::Collectives* dp_;
    std::map<int32_t, std::unique_ptr<StageState>>& stages_;
    bool split_ = false;
    transport::Collectives* edp_ = nullptr;
    Tensor share_; // this member's summed share of a scattered unit
    std::mutex mutex_;
    std::condition_variable cv_;
    std::deque<std::pair<std::function<void()>, size_t>> queue_;
    std::vector<ActionTiming> ran_; // under mutex_
    uint64_t queued_ = 0, done_ = 0;
    bool stop_ = false;
    std::exception_ptr error_;
    kernels::Backend& device_;
    Tensor buffer_; // on the device
    std::thread thread_;
};

// ----- ZeRO 2 and 3: each unit's gradients reduce-scattered as its backward leaves them -----

// A member keeps only its share of each gradient between units, reduced (Parameter::
// grad_share), as DeepSpeed's ZeRO 2 and FSDP do. Before a unit's weight gradient its
// parameters get whole gradient buffers, cleared; once they are in, the buffers go to
// the communication thread, which reduce-scatters them, adds this member's share, and frees
// them. Every microbatch's backward does this (a parameter two units read, a tied embedding,
// after the last of them): the gradients are never whole beyond two units at once, the one
// computing and the one being reduced, for the price of a reduction per microbatch. Wraps
// ZeRO 3's WeightGatherer, when there is one, as the stage has one set of hooks.
class RankExecutor::GradientScatterer final : public models::UnitHooks {
  public:
    GradientScatterer(models::Stage& stage, Reducer& comm, const RankComms& comms, int32_t ep,
                      kernels::Backend& device, models::UnitHooks* inner)
        : units_(stage.unit_parameters()), comm_(comm), comms_(comms), ep_(ep), device_(device),
          inner_(inner) {
        for (const auto& unit : units_)
            for (models::Parameter* p : unit) ++uses_[p];
    }

    void before(size_t unit, Phase phase) override {
        if (inner_) inner_->before(unit, phase);
        if (phase != Phase::backward_weight) return; // the only phase that writes gradients
        for (models::Parameter* p : units_[unit])
            if (!p->grad.defined()) p->grad = device_.zeros(p->shape);
    }

    void after(size_t unit, Phase phase) override {
        if (phase == Phase::backward_weight) {
            // The parameters whose every reader has added its gradient for this microbatch.
            std::vector<models::Parameter*> done;
            std::vector<Tensor> grads;
            for (models::Parameter* p : units_[unit]) {
                if (++seen_[p] < uses_[p]) continue;
                seen_[p] = 0;
                done.push_back(p);
                grads.push_back(std::move(p->grad));
                p->grad = Tensor();
            }
            if (!done.empty()) {
                device_.synchronize(); // the gradients are in before another thread reads them
                const uint64_t ticket = comm_.run(
                    [this, done = std::move(done), grads = std::move(grads)] {
                        comm_.scatter(done, grads, comms_, ep_);
                    },
                    comm_.scattering);
                // At most two units' gradients whole: wait for the one before.
                if (last_ > 0) comm_.wait_for(last_);
                last_ = ticket;
            }
        }
        if (inner_) inner_->after(unit, phase);
    }

  private:
    const std::vector<std::vector<models::Parameter*>>& units_;
    Reducer& comm_;
    const RankComms& comms_;
    int32_t ep_;
    kernels::Backend& device_;
    models::UnitHooks* inner_;
    std::map<models::Parameter*, int> uses_, seen_;
    uint64_t last_ = 0;
};

// ----- ZeRO 3: the weights of a unit, gathered while it computes ----------------------------

// Between uses every member of the data-parallel group holds only its share of each
// parameter's values (Parameter::owned). Before a unit's forward or input gradient its weights
// are all-gathered on the communication thread, queued behind the reductions already there
// (every member queues the same collectives in the same order), and the next unit's are queued
// at once (prefetch); after it they are freed. The weight gradient reads no weights. The
// plan's GATHER_F and GATHER_B queue the first unit of the coming pass one action ahead.
// Under expert parallelism a routed expert is gathered from its holders (the expert-data-
// parallel group; with one holder it stays whole and is only copied), the rest from the
// data-parallel group: every member queues the same gathers in the same order, so each group's
// members meet in each of theirs.
class RankExecutor::WeightGatherer final : public models::UnitHooks {
  public:
    WeightGatherer(models::Stage& stage, Reducer& comm, const RankComms& comms, int32_t ep,
                   kernels::Backend& device)
        : units_(stage.unit_parameters()), comm_(comm), comms_(comms), ep_(ep), device_(device) {}

    void before(size_t unit, Phase phase) override {
        if (phase == Phase::backward_weight) return;
        request(unit, phase);
        bool fwd = phase == Phase::forward;
        if (fwd ? unit + 1 < units_.size() : unit > 0) request(fwd ? unit + 1 : unit - 1, phase);
        for (models::Parameter* p : units_[unit]) comm_.wait_for(held_[p].ticket);
    }

    void after(size_t unit, Phase phase) override {
        if (phase == Phase::backward_weight) return;
        auto it = requested_.find({unit, phase});
        if (it == requested_.end()) return;
        requested_.erase(it);
        for (models::Parameter* p : units_[unit]) {
            Held& h = held_[p];
            if (--h.refs == 0) p->value = Tensor(); // back to the allocator
        }
    }

    /// GATHER_F / GATHER_B: queue the first unit the coming pass needs.
    void prefetch(bool forward) {
        if (units_.empty()) return;
        request(forward ? 0 : units_.size() - 1, forward ? Phase::forward : Phase::backward_input);
    }

    /// Until the first unit of the coming pass, when it was queued, is in: before the action's
    /// clock starts, since the simulator counts that wait as idle (the compute starts once its
    /// first unit has arrived).
    void await_first(bool forward) {
        if (units_.empty()) return;
        for (models::Parameter* p : units_[forward ? 0 : units_.size() - 1]) {
            auto it = held_.find(p);
            if (it != held_.end() && it->second.refs > 0) comm_.wait_for(it->second.ticket);
        }
    }

  private:
    struct Held {
        int refs = 0;
        uint64_t ticket = 0;
    };

    void request(size_t unit, Phase phase) {
        if (!requested_.insert({unit, phase}).second) return;
        std::vector<models::Parameter*> fresh;
        for (models::Parameter* p : units_[unit]) {
            Held& h = held_[p];
            if (h.refs++ > 0) continue;
            p->value = device_.empty(p->shape);
            fresh.push_back(p);
        }
        if (fresh.empty()) return;
        const uint64_t ticket = comm_.run([this, fresh] { gather(fresh); }, comm_.gathering);
        for (models::Parameter* p : fresh) held_[p].ticket = ticket;
    }

    // The members' shares of a unit's parameters into their values: one all-gather per group
    // (the data-parallel one, a routed expert's holders), each member's shares packed in
    // parameter order and padded to the longest, as FSDP gathers a unit's flat parameter.
    void gather(const std::vector<models::Parameter*>& params) {
        for (const StatePart& part : by_state_group(params, comms_, ep_)) {
            if (!part.group.comms) { // their only holder: each share is the whole
                for (size_t i : part.at)
                    if (const int64_t own = params[i]->owned.numel(); own > 0)
                        device_.copy_block(params[i]->owned.data<float>(), own,
                                           params[i]->value.data<float>(), own, 1, own);
                continue;
            }
            const int members = part.group.members;
            const int64_t chunk = part.chunk;
            if (chunk == 0) continue;
            if (mine_.numel() < chunk) mine_ = device_.empty({chunk});
            if (all_.numel() < chunk * members) all_ = device_.empty({chunk * members});
            int64_t at = 0;
            for (size_t i : part.at) {
                const int64_t own = params[i]->owned.numel();
                if (own > 0)
                    device_.copy_block(params[i]->owned.data<float>(), own,
                                       mine_.data<float>() + at, own, 1, own);
                at += own;
            }
            part.group.comms->all_gather(mine_.data<float>(), chunk, all_.data<float>());
            for (int d = 0; d < members; ++d) {
                at = d * chunk;
                for (size_t i : part.at) {
                    auto [lo, hi] = zero_share(params[i]->numel(), d, members);
                    if (hi > lo)
                        device_.copy_block(all_.data<float>() + at, hi - lo,
                                           params[i]->value.data<float>() + lo, hi - lo, 1,
                                           hi - lo);
                    at += hi - lo;
                }
            }
        }
    }

    const std::vector<std::vector<models::Parameter*>>& units_;
    Reducer& comm_;
    const RankComms& comms_;
    int32_t ep_;
    kernels::Backend& device_;
    std::map<models::Parameter*, Held> held_;
    std::set<std::pair<size_t, Phase>> requested_;
    Tensor mine_, all_; // used on the communication thread only
};

// ----- the all-to-alls' clock -------------------------------------------------------------------

// The expert-parallel group with a clock on its all-to-alls (the mixtures of experts' dispatch
// and combine); everything else passes through.
class RankExecutor::ExchangeClock final : public transport::Collectives {
  public:
    explicit ExchangeClock(transport::Collectives& inner) : inner_(inner) {}
    int rank() const override { return inner_.rank(); }
    int size() const override { return inner_.size(); }
    void all_reduce(float* data, int64_t n, transport::ReduceOp op) override {
        inner_.all_reduce(data, n, op);
    }
    void all_gather(const float* in, int64_t n, float* out) override {
        inner_.all_gather(in, n, out);
    }
    void reduce_scatter(const float* in, int64_t n, float* out) override {
        inner_.reduce_scatter(in, n, out);
    }
    void broadcast(float* data, int64_t n, int root) override { inner_.broadcast(data, n, root); }
    void all_to_all(const float* in, const std::vector<int64_t>& send, float* out,
                    const std::vector<int64_t>& recv) override {
        auto t0 = std::chrono::steady_clock::now();
        inner_.all_to_all(in, send, out, recv);
        if (on_) ran_.emplace_back(seconds(t0), seconds(std::chrono::steady_clock::now()));
    }
    void abort() override { inner_.abort(); }

    /// Times the all-to-alls from now on (a step), or no longer (a generation's forwards).
    void time(bool on) {
        on_ = on;
        ran_.clear();
    }
    /// The (start, end) of each all-to-all since the last call, on the host's monotonic clock.
    std::vector<std::pair<double, double>> take() { return std::exchange(ran_, {}); }

  private:
    static double seconds(std::chrono::steady_clock::time_point t) {
        return std::chrono::duration<double>(t.time_since_epoch()).count();
    }
    transport::Collectives& inner_;
    std::vector<std::pair<double, double>> ran_; // the compute thread's only
    bool on_ = false;
};

// ----- the executor ---------------------------------------------------------------------------

RankExecutor::RankExecutor(const Program& program, const plan::Graph& graph, int32_t rank,
                           RankComms comms, kernels::Backend* device)
    : program_(program), graph_(graph), rank_(rank), me_(graph.ranks.at(static_cast<size_t>(rank))),
      comms_(comms), device_(device ? device : &kernels::cpu_backend()),
      tied_name_(tied_embedding(program.model)) {
    if (graph.ep > 1 && comms_.ep) {
        exchange_clock_ = std::make_unique<ExchangeClock>(*comms_.ep);
        comms_.ep = exchange_clock_.get();
    }
    for (const auto& a : me_.actions)
        if (plan::is_compute(a.kind) && !stages_.count(a.stage))
            stages_.emplace(
                a.stage, std::make_unique<StageState>(graph.stages.at(static_cast<size_t>(a.stage)),
                                                      program, comms_, *device_));
    if (comms_.dp && comms_.dp->size() > 1) {
        zero_ = graph.zero;
        reducer_ = std::make_unique<Reducer>(comms_.dp, stages_, *device_);
        if (graph.ep > 1) reducer_->split_experts(comms_.edp);
    }
    if (zero_ >= 1) {
        // Each member keeps the AdamW moments of its share of every parameter only: its share
        // within the ranks that hold the parameter (a routed expert's own under ep).
        for (auto& [i, s] : stages_) {
            for (auto& p : s->stage.params().all()) {
                const StateGroup group = state_group(p, comms_, graph_.ep);
                auto [lo, hi] = zero_share(p.value.numel(), group.me, group.members);
                p.state_begin = lo;
                p.m = device_->empty({hi - lo});
                p.v = device_->empty({hi - lo});
                p.m.fill_zero();
                p.v.fill_zero();
                if (zero_ < 2) continue;
                // ZeRO 2 and 3: the reduced gradient of the share only; whole ones come and go
                // unit by unit (GradientScatterer).
                p.grad_share = device_->zeros({hi - lo});
                p.grad = Tensor();
                if (zero_ < 3) continue;
                // ZeRO 3: only the share of the values stays; units gather the rest.
                p.owned = device_->empty({hi - lo});
                if (hi > lo)
                    device_->copy_block(p.value.data<float>() + lo, hi - lo, p.owned.data<float>(),
                                        hi - lo, 1, hi - lo);
                p.value = Tensor();
            }
            if (zero_ >= 3)
                gatherers_[i] = std::make_unique<WeightGatherer>(s->stage, *reducer_, comms_,
                                                                 graph_.ep, *device_);
            if (zero_ >= 2) {
                auto g = std::make_unique<GradientScatterer>(
                    s->stage, *reducer_, comms_, graph_.ep, *device_,
                    zero_ >= 3 ? gatherers_[i].get() : nullptr);
                s->stage.set_hooks(g.get());
                scatterers_[i] = std::move(g);
            }
        }
    }
    int64_t rows = program.train.batch / graph.dp;
    microbatch_rows_ = rows / graph.microbatches;
    if (microbatch_rows_ * graph.microbatches * graph.dp != program.train.batch)
        throw std::invalid_argument("a batch of " + std::to_string(program.train.batch) +
                                    " does not split into " + std::to_string(graph.dp) + " x " +
                                    std::to_string(graph.microbatches) + " microbatches");
    tokens_ = Tensor({rows, program.model.context}, kernels::DType::i32);
    targets_ = Tensor({rows, program.model.context}, kernels::DType::i32);
}

RankExecutor::~RankExecutor() = default;

std::map<int32_t, models::Stage*> RankExecutor::stages() {
    std::map<int32_t, models::Stage*> out;
    for (auto& [i, s] : stages_) out[i] = &s->stage;
    return out;
}

std::string RankExecutor::current_action() const {
    std::lock_guard lock(current_mutex_);
    return current_;
}

RankStepResult RankExecutor::run_step(int64_t step, const models::TokenData& data) {
    using clock = std::chrono::steady_clock;
    // Times on the host's monotonic clock, which every process of a host shares: the ranks'
    // actions line up in one timeline (runtime/measured.cpp takes the earliest as zero).
    auto since = [](clock::time_point t) { return seconds_of(t); };
    // The collective actions of each stage and microbatch: what the communication thread's
    // work queued inside a compute action is part of.
    std::map<std::tuple<plan::ActionKind, int32_t, int32_t>, size_t> collective_at;
    for (size_t i = 0; i < me_.actions.size(); ++i) {
        const plan::PlanAction& a = me_.actions[i];
        if (plan::is_dp_collective(a.kind)) collective_at[{a.kind, a.stage, a.microbatch}] = i;
    }
    auto collective_of = [&](plan::ActionKind kind, const plan::PlanAction& a, size_t i) {
        auto it = collective_at.find({kind, a.stage, a.microbatch});
        return it == collective_at.end() ? i : it->second;
    };
    auto start = clock::now();
    // The rank's thread runs a CPU rank's kernels: its CPU clock is the action's time on a core
    // (a GPU rank's thread waits for the device as it likes, spinning or not).
    const bool cpu_clock = device_ == &kernels::cpu_backend();
    RankStepResult result;
    const int64_t T = program_.model.context;
    data.batch(static_cast<uint64_t>(program_.train.seed), step, program_.train.batch, T, me_.dp,
               graph_.dp, tokens_.data<int32_t>(), targets_.data<int32_t>());
    for (auto& [i, s] : stages_) {
        s->clear();
        s->stage.params().zero_grads();
    }
    // All-to-alls outside a step (an evaluation's or a generation's forwards) are not timed.
    struct Timed {
        ExchangeClock* clock;
        explicit Timed(ExchangeClock* c) : clock(c) {
            if (clock) clock->time(true);
        }
        ~Timed() {
            if (clock) clock->time(false);
        }
    } timed(exchange_clock_.get());
    exchanges_ran_.clear();
    // The step's receives, posted ahead where the transport can (UCX across processes).
    for (const plan::PlanAction& a : me_.actions) {
        if (a.kind == plan::ActionKind::recv_forward)
            comms_.p2p->expect(a.peer,
                               {step, a.stage - 1, a.microbatch, transport::Direction::activation});
        else if (a.kind == plan::ActionKind::recv_backward)
            comms_.p2p->expect(a.peer,
                               {step, a.stage + 1, a.microbatch, transport::Direction::gradient});
    }
    for (size_t i = 0; i < me_.actions.size(); ++i) {
        const plan::PlanAction& a = me_.actions[i];
        {
            std::lock_guard lock(current_mutex_);
            current_ = plan::to_string(a);
        }
        if (a.kind == plan::ActionKind::forward || a.kind == plan::ActionKind::backward ||
            a.kind == plan::ActionKind::backward_input) {
            auto it = gatherers_.find(a.stage);
            if (it != gatherers_.end())
                it->second->await_first(a.kind == plan::ActionKind::forward);
        }
        auto t0 = clock::now();
        double cpu0 = cpu_clock ? thread_cpu_seconds() : 0.0;
        if (hook_) hook_(step, a);
        if (plan::is_exchange(a.kind)) {
            // Run inside the compute action before it: its time is the one measured there.
            if (exchanges_ran_.empty())
                throw std::logic_error("rank " + std::to_string(rank_) + ": the plan lists `" +
                                       plan::to_string(a) +
                                       "`, but its compute action ran no all-to-all for it");
            result.timings.push_back(
                {i, exchanges_ran_.front().first, exchanges_ran_.front().second});
            exchanges_ran_.erase(exchanges_ran_.begin());
            ++progress_;
            continue;
        }
        if (!exchanges_ran_.empty() && !(i > 0 && me_.actions[i - 1].overlap_next))
            throw std::logic_error("rank " + std::to_string(rank_) + ": " +
                                   std::to_string(exchanges_ran_.size()) +
                                   " all-to-all(s) ran that the plan does not list before `" +
                                   plan::to_string(a) + "`");
        if (a.kind == plan::ActionKind::step) {
            finish_step(step, result);
            // The update's time: what went before it (the reductions, the norm's all-reduce
            // over the replica) is waiting for other ranks, as the simulator counts it.
            t0 = update_began_;
            cpu0 = update_began_cpu_;
        } else {
            action_index_ = i;
            if (reducer_) {
                using plan::ActionKind;
                const bool fwd = a.kind == ActionKind::forward;
                reducer_->gathering =
                    plan::is_dp_collective(a.kind)
                        ? i
                        : collective_of(
                              fwd ? ActionKind::gather_forward : ActionKind::gather_backward, a, i);
                reducer_->scattering = collective_of(ActionKind::reduce_scatter, a, i);
            }
            execute(a, step, result);
        }
        // An action's time is the device's: its kernels have run when it is over (a GPU queues
        // them), so the trace and the measured bubble show the work, not its launch.
        device_->synchronize();
        result.timings.push_back({i, since(t0), since(clock::now()), false,
                                  cpu_clock ? thread_cpu_seconds() - cpu0 : -1.0});
        if (exchange_clock_)
            for (const auto& ran : exchange_clock_->take()) exchanges_ran_.push_back(ran);
        ++progress_;
    }
    if (!exchanges_ran_.empty())
        throw std::logic_error("rank " + std::to_string(rank_) + ": " +
                               std::to_string(exchanges_ran_.size()) +
                               " all-to-all(s) ran that the plan does not list");
    if (reducer_) { // every one has run: STEP waited for them
        std::vector<ActionTiming> ran = reducer_->take_ran();
        result.timings.insert(result.timings.end(), ran.begin(), ran.end());
    }
    comms_.p2p->flush(); // sends to other processes complete before the step is over
    {
        std::lock_guard lock(current_mutex_);
        current_.clear();
    }
    result.step_time_s = std::chrono::duration<double>(clock::now() - start).count();
    return result;
}

void RankExecutor::execute(const plan::PlanAction& a, int64_t step, RankStepResult& result) {
    using plan::ActionKind;
    using transport::Direction;
    const int32_t s = a.stage, mb = a.microbatch;
    const bool bf16 = program_.train.precision == Precision::bf16;
    auto state = [&](int32_t stage) -> StageState& {
        auto it = stages_.find(stage);
        if (it == stages_.end())
            throw std::logic_error("rank " + std::to_string(rank_) + " does not hold stage " +
                                   std::to_string(stage));
        return *it->second;
    };
    switch (a.kind) {
    case ActionKind::forward: {
        StageState& st = state(s);
        // Under context parallelism this rank's two chunks of each sequence (ContextParallel).
        const int64_t T = program_.model.context, cp = graph_.cp, c = T / (2 * cp);
        Tensor mb_tokens({microbatch_rows_, T / cp}, kernels::DType::i32);
        Tensor mb_targets(mb_tokens.shape(), kernels::DType::i32);
        for (int64_t row = 0; row < microbatch_rows_; ++row) {
            const int64_t from = (mb * microbatch_rows_ + row) * T;
            for (int64_t h = 0; h < (cp > 1 ? 2 : 1); ++h) {
                const int64_t chunk =
                    models::context_chunk(static_cast<int>(h), me_.cp, static_cast<int>(cp));
                const int64_t count = cp > 1 ? c : T, at = cp > 1 ? chunk * c : 0;
                const size_t bytes = static_cast<size_t>(count) * sizeof(int32_t);
                std::memcpy(mb_tokens.data<int32_t>() + row * (T / cp) + h * c,
                            tokens_.data<int32_t>() + from + at, bytes);
                std::memcpy(mb_targets.data<int32_t>() + row * (T / cp) + h * c,
                            targets_.data<int32_t>() + from + at, bytes);
            }
        }
        kernels::Backend& dev = *device_;
        models::Batch batch{dev.here(mb_tokens), dev.here(mb_targets)};
        batch.loss_weight = 1.0 / static_cast<double>(graph_.microbatches);
        Tensor input = st.info.embedding          ? batch.tokens
                       : st.inputs.count(mb) != 0 ? take(st.inputs, mb, "input", s)
                                                  : take(state(s - 1).outputs, mb, "output", s - 1);
        Tensor out = st.stage.forward(mb, input, batch);
        if (st.info.head) {
            double sum = dev.sum(out.data<float>(), out.numel());
            if (me_.tp == 0) {
                result.loss_sum += sum / static_cast<double>(out.numel());
                ++result.loss_microbatches;
            }
            st.loss_shape[mb] = out.shape();
        } else {
            st.outputs[mb] = out;
        }
        break;
    }
    case ActionKind::backward:
    case ActionKind::backward_input: {
        StageState& st = state(s);
        Tensor dy;
        if (st.info.head) {
            auto it = st.loss_shape.find(mb);
            if (it == st.loss_shape.end())
                throw std::logic_error("backward of microbatch " + std::to_string(mb) +
                                       " before its forward");
            dy = device_->empty(it->second);
            float w = static_cast<float>(1.0 / static_cast<double>(graph_.microbatches) /
                                         static_cast<double>(dy.numel()));
            device_->fill(dy.data<float>(), dy.numel(), w);
            st.loss_shape.erase(it);
        } else {
            dy = st.grad_in.count(mb) != 0
                     ? take(st.grad_in, mb, "output gradient", s)
                     : take(state(s + 1).grad_out, mb, "input gradient", s + 1);
        }
        // A whole backward frees each unit's state as it goes; a split one keeps what the
        // weight gradients need until their action.
        Tensor dx = a.kind == ActionKind::backward ? st.stage.backward(mb, dy)
                                                   : st.stage.backward_input(mb, dy);
        if (!st.info.embedding) st.grad_out[mb] = dx;
        break;
    }
    case ActionKind::backward_weight: state(s).stage.backward_weight(mb); break;
    case ActionKind::send_forward:
        comms_.p2p->send(a.peer, {step, s, mb, Direction::activation},
                         narrowed(take(state(s).outputs, mb, "output", s), *device_, bf16));
        break;
    case ActionKind::recv_forward:
        state(s).inputs[mb] =
            widened(comms_.p2p->recv(a.peer, {step, s - 1, mb, Direction::activation}), *device_);
        break;
    case ActionKind::send_backward:
        comms_.p2p->send(
            a.peer, {step, s, mb, Direction::gradient},
            narrowed(take(state(s).grad_out, mb, "input gradient", s), *device_, bf16));
        break;
    case ActionKind::recv_backward:
        state(s).grad_in[mb] =
            widened(comms_.p2p->recv(a.peer, {step, s + 1, mb, Direction::gradient}), *device_);
        break;
    case ActionKind::reduce_grad:
        if (reducer_) reducer_->enqueue(s, mb, action_index_);
        break;
    case ActionKind::reduce_scatter: break; // queued unit by unit in the backward before it
    case ActionKind::gather_forward:
    case ActionKind::gather_backward: {
        auto it = gatherers_.find(s);
        if (it != gatherers_.end()) it->second->prefetch(a.kind == ActionKind::gather_forward);
        break;
    }

    case ActionKind::step:
    case ActionKind::dispatch_forward: // run inside their compute action (run_step)
    case ActionKind::combine_forward:
    case ActionKind::combine_backward:
    case ActionKind::dispatch_backward: break;
    }
}

void RankExecutor::sum_sequence_partial_gradients() {
    // Sequence parallelism: the norms and positions saw this rank's tokens only; their
    // gradients are summed over the tensor-parallel group, in parameter order, as one buffer.
    if (!comms_.tp || comms_.tp->size() == 1) return;
    std::vector<models::Parameter*> partial;
    int64_t total = 0;
    for (auto& [i, s] : stages_)
        for (auto& p : s->stage.params().all())
            if (p.sequence_partial) {
                partial.push_back(&p);
                total += reduced_gradient(p).second;
            }
    if (partial.empty()) return;
    Tensor buffer = device_->empty({total});
    int64_t at = 0;
    for (auto* p : partial) {
        auto [g, n] = reduced_gradient(*p);
        device_->copy_block(g, n, buffer.data<float>() + at, n, 1, n);
        at += n;
    }
    comms_.tp->all_reduce(buffer.data<float>(), total, transport::ReduceOp::sum);
    at = 0;
    for (auto* p : partial) {
        auto [g, n] = reduced_gradient(*p);
        device_->copy_block(buffer.data<float>() + at, n, g, n, 1, n);
        at += n;
    }
}

void RankExecutor::sum_tied_gradients() {
    const std::string& name = tied_name_;
    if (name.empty() || graph_.num_stages() < 2) return;
    std::vector<models::Parameter*> held;
    for (auto& [i, s] : stages_)
        if (auto* p = s->stage.params().find(name)) held.push_back(p);
    if (held.empty()) return;
    if (held.size() == 2) {
        // Embedding and head on this rank (a V-shaped schedule): sum the two locally.
        auto [a, n] = reduced_gradient(*held[0]);
        float* b = reduced_gradient(*held[1]).first;
        device_->add(a, b, n, a);
        device_->copy_block(a, n, b, n, 1, n);
        return;
    }
    if (!comms_.tied) return; // the head is not tied across ranks (one pipeline rank)
    auto [g, n] = reduced_gradient(*held[0]);
    comms_.tied->all_reduce(g, n, transport::ReduceOp::sum);
}

double RankExecutor::gradient_norm(bool& loss_nonfinite, double loss_sum) {
    std::vector<kernels::Backend::Part> grads, experts;
    for (auto& [i, s] : stages_) {
        const auto& copies = s->stage.tied_copies();
        for (auto& p : s->stage.params().all()) {
            // Count every parameter once per model replica: a tied copy not at all, a parameter
            // replicated over the tensor-parallel ranks only on the first of them.
            if (std::find(copies.begin(), copies.end(), p.name) != copies.end()) continue;
            if (p.shard.whole() && me_.tp != 0) continue;
            // Under expert parallelism the members of an expert group hold different experts,
            // and under ZeRO each holder of an expert its share of it.
            auto& into = p.expert && comms_.ep ? experts : grads;
            if (zero_ >= 1 && p.m.numel() > 0)
                into.push_back({p.state_grad(), p.m.numel()});
            else if (zero_ == 0)
                into.push_back({p.grad.data<float>(), p.grad.numel()});
        }
    }
    double sq = device_->sum_squares_of(grads);
    if (zero_ >= 1) {
        // Each member counted its share of the replicated parameters: sum over the group.
        sq = summed_over(*comms_.dp, *device_, static_cast<float>(sq));
    }
    if (comms_.ep) {
        // The experts' shares over their holders, then the expert group's different experts.
        auto held = static_cast<float>(experts.empty() ? 0.0 : device_->sum_squares_of(experts));
        if (zero_ >= 1 && comms_.edp) held = summed_over(*comms_.edp, *device_, held);
        sq += summed_over(*comms_.ep, *device_, held);
    }
    // The replica's loss lives on its last stage: whether it is finite travels with the norm.
    float v[2] = {static_cast<float>(sq), std::isfinite(loss_sum) ? 0.0f : 1.0f};
    if (comms_.model && comms_.model->size() > 1) {
        // Reduced in float like every collective here: the norm needs no more precision.
        comms_.model->all_reduce(v, 2, transport::ReduceOp::sum);
        sq = v[0];
    }
    loss_nonfinite = v[1] != 0.0f;
    return std::sqrt(sq);
}

void RankExecutor::finish_step(int64_t step, RankStepResult& result) {
    if (reducer_) reducer_->wait();
    // The data-parallel reduction has finished with the tied embedding's gradient: sum the
    // copies of the first and last stage (Megatron-LM's embedding group).
    sum_tied_gradients();
    sum_sequence_partial_gradients();
    if (graph_.ep > 1 && !comms_.edp && comms_.dp && comms_.dp->size() > 1 && zero_ < 2) {
        // Every expert here has one holder in the data-parallel group (dp x cp = ep): its
        // gradient already sums every member's tokens, and only the average is left (ZeRO 2
        // and 3 took it as they reduced).
        const double inv = 1.0 / static_cast<double>(comms_.dp->size());
        for (auto& [i, s] : stages_)
            for (auto& p : s->stage.params().all())
                if (p.expert) device_->scale(p.grad.data<float>(), p.grad.numel(), inv);
    }
    // What the routers saw, counted once per replica group of tensor-parallel ranks.
    for (auto& [i, s] : stages_) {
        models::ExpertStats seen = s->stage.take_expert_stats();
        if (me_.tp == 0) result.experts.merge(seen);
    }
    bool loss_nonfinite = false;
    result.grad_norm = gradient_norm(loss_nonfinite, result.loss_sum);
    update_began_ = std::chrono::steady_clock::now();
    update_began_cpu_ = thread_cpu_seconds();
    // The guard before any weight moves. Every rank of a replica sees the same two values (one
    // reduction), and every replica the same norm: a non-finite loss comes from non-finite
    // logits, whose gradients reach every replica through the data-parallel sum. So all ranks
    // skip the update alike (a NaN norm would also pass a clip test, `norm > clip` being false).
    if (loss_nonfinite || !std::isfinite(result.grad_norm)) {
        result.nonfinite = loss_nonfinite ? "loss" : "gradient norm";
        result.lr = models::learning_rate(program_.train, step);
        return;
    }
    std::vector<models::Parameter*> params;
    for (auto& [i, s] : stages_)
        for (auto& p : s->stage.params().all()) params.push_back(&p);
    result.lr = models::optimizer_step(program_.train, step, result.grad_norm, params, *device_);
    if (zero_ == 1 || zero_ == 2) gather_weights();
}

void RankExecutor::gather_weights() {
    // Every member updated its share of every parameter: all-gather the shares, stage by stage
    // and group by group (routed experts among their holders under ep), each member's packed in
    // parameter order and padded to the longest.
    for (auto& [i, s] : stages_) {
        std::vector<models::Parameter*> all;
        for (auto& p : s->stage.params().all()) all.push_back(&p);
        for (const StatePart& part : by_state_group(all, comms_, graph_.ep)) {
            if (part.group.members < 2 || part.chunk == 0) continue;
            std::vector<models::Parameter*> params;
            for (size_t k : part.at) params.push_back(all[k]);
            gather_shares(params, part.group, part.chunk);
        }
    }
}

void RankExecutor::gather_shares(const std::vector<models::Parameter*>& params,
                                 const StateGroup& group, int64_t chunk) {
    const int members = group.members, me = group.me;
    Tensor mine = device_->empty({chunk}), all = device_->empty({chunk * members});
    mine.fill_zero();
    int64_t at = 0;
    for (auto* p : params) {
        auto [lo, hi] = zero_share(p->value.numel(), me, members);
        if (hi > lo)
            device_->copy_block(p->value.data<float>() + lo, hi - lo, mine.data<float>() + at,
                                hi - lo, 1, hi - lo);
        at += hi - lo;
    }
    group.comms->all_gather(mine.data<float>(), chunk, all.data<float>());
    for (int d = 0; d < members; ++d) {
        if (d == me) continue;
        at = d * chunk;
        for (auto* p : params) {
            auto [lo, hi] = zero_share(p->value.numel(), d, members);
            if (hi > lo)
                device_->copy_block(all.data<float>() + at, hi - lo, p->value.data<float>() + lo,
                                    hi - lo, 1, hi - lo);
            at += hi - lo;
        }
    }
}

} // namespace dist::runtime
