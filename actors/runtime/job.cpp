// job.cpp: the coordinator and worker actors (CAF 0.17) around the rank executors.
#include "actors/runtime/job.hpp"

#include <caf/all.hpp>
#include <omp.h>

#include <algorithm>
#include <thread>

namespace dist::runtime {

namespace {

using run_atom = caf::atom_constant<caf::atom("run")>;
using start_atom = caf::atom_constant<caf::atom("start")>;
using tick_atom = caf::atom_constant<caf::atom("tick")>;

/// A worker's answer to "run step s".
struct StepOutcome {
    int32_t rank = -1;
    bool ok = false;
    std::string action, cause; // when not ok
    double loss_sum = 0;
    int64_t loss_microbatches = 0;
    double grad_norm = 0, lr = 0, step_time_s = 0;
    std::vector<double> timings; // (action index, start, end) triples
};

template <class Inspector> typename Inspector::result_type inspect(Inspector& f, StepOutcome& x) {
    return f(caf::meta::type_name("StepOutcome"), x.rank, x.ok, x.action, x.cause, x.loss_sum,
             x.loss_microbatches, x.grad_norm, x.lr, x.step_time_s, x.timings);
}

// The contract between the coordinator and the workers.
using worker_actor = caf::typed_actor<caf::replies_to<run_atom, int64_t>::with<StepOutcome>>;
using coordinator_actor =
    caf::typed_actor<caf::replies_to<start_atom>::with<std::string>, caf::reacts_to<tick_atom>>;

worker_actor::behavior_type worker(worker_actor::pointer, RankExecutor* ex,
                                   const models::TokenData* data, int threads) {
    return {[=](run_atom, int64_t step) -> StepOutcome {
        // The worker's share of the cores (an OpenMP setting of this thread only).
        omp_set_num_threads(threads);
        StepOutcome o;
        o.rank = ex->rank();
        try {
            RankStepResult r = ex->run_step(step, *data);
            o.ok = true;
            o.loss_sum = r.loss_sum;
            o.loss_microbatches = r.loss_microbatches;
            o.grad_norm = r.grad_norm;
            o.lr = r.lr;
            o.step_time_s = r.step_time_s;
            for (const auto& t : r.timings)
                o.timings.insert(o.timings.end(),
                                 {static_cast<double>(t.action), t.start_s, t.end_s});
        } catch (const std::exception& e) {
            o.action = ex->current_action();
            o.cause = e.what();
        } catch (...) {
            o.action = ex->current_action();
            o.cause = "an exception that is not a std::exception";
        }
        return o;
    }};
}

struct CoordinatorState {
    std::vector<worker_actor> workers;
    std::vector<RankExecutor*> executors;
    LocalComms* comms = nullptr;
    JobOptions options;
    int64_t tokens_per_step = 0;
    int64_t step = 0;
    size_t pending = 0;
    std::vector<StepOutcome> replies;
    std::string failure;
    bool finished = false;
    caf::typed_response_promise<std::string> promise;
    uint64_t last_progress = 0;
    std::chrono::steady_clock::time_point last_change;
    std::chrono::steady_clock::time_point step_start;
};

using coordinator_pointer = coordinator_actor::stateful_pointer<CoordinatorState>;

void fail(coordinator_pointer self, const std::string& why) {
    auto& st = self->state;
    if (!st.failure.empty()) return;
    st.failure = why;
    // Wake every rank blocked on a peer: they end the step with an error instead of hanging.
    st.comms->abort(why);
}

void finish(coordinator_pointer self, const std::string& result) {
    self->state.finished = true;
    self->state.promise.deliver(result);
    self->quit();
}

void start_step(coordinator_pointer self);

void step_done(coordinator_pointer self) {
    auto& st = self->state;
    if (!st.failure.empty()) return finish(self, st.failure);
    StepReport report;
    double loss = 0, secs = 0;
    int64_t n = 0;
    report.timings.resize(st.replies.size());
    for (const auto& o : st.replies) {
        loss += o.loss_sum;
        n += o.loss_microbatches;
        auto& t = report.timings[static_cast<size_t>(o.rank)];
        for (size_t i = 0; i + 2 < o.timings.size(); i += 3)
            t.push_back({static_cast<size_t>(o.timings[i]), o.timings[i + 1], o.timings[i + 2]});
    }
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - st.step_start).count();
    const StepOutcome& any = st.replies.front();
    models::StepMetrics& m = report.metrics;
    m.step = st.step + 1;
    m.loss = n > 0 ? loss / static_cast<double>(n) : 0.0;
    m.lr = any.lr;
    m.grad_norm = any.grad_norm;
    m.tokens = st.tokens_per_step;
    m.step_time_s = secs;
    m.tokens_per_s = secs > 0 ? static_cast<double>(m.tokens) / secs : 0.0;
    bool go_on = !st.options.on_step || st.options.on_step(report);
    if (!go_on || st.step + 1 >= st.options.end_step) return finish(self, "");
    ++st.step;
    start_step(self);
}

void start_step(coordinator_pointer self) {
    auto& st = self->state;
    st.replies.clear();
    st.pending = st.workers.size();
    st.step_start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < st.workers.size(); ++i) {
        auto on_reply = [self](StepOutcome& o) {
            auto& s = self->state;
            if (!o.ok) fail(self, RankFailure{o.rank, o.action, o.cause}.str());
            s.replies.push_back(std::move(o));
            if (--s.pending == 0) step_done(self);
        };
        self->request(st.workers[i], caf::infinite, run_atom::value, st.step)
            .then(on_reply, [self, on_reply, i](caf::error& e) {
                StepOutcome o;
                o.rank = static_cast<int32_t>(i);
                o.cause = "the worker is gone: " + self->system().render(e);
                on_reply(o);
            });
    }
}

coordinator_actor::behavior_type coordinator(coordinator_pointer self, CoordinatorState setup) {
    self->state = std::move(setup);
    return {
        [self](start_atom) -> caf::typed_response_promise<std::string> {
            auto& st = self->state;
            st.promise = self->make_response_promise<std::string>();
            st.step = st.options.first_step;
            st.last_change = std::chrono::steady_clock::now();
            if (st.step >= st.options.end_step) {
                finish(self, "");
                return st.promise;
            }
            self->delayed_send(self, std::chrono::milliseconds(200), tick_atom::value);
            start_step(self);
            return st.promise;
        },
        [self](tick_atom) {
            auto& st = self->state;
            if (st.finished) return;
            uint64_t progress = 0;
            for (auto* ex : st.executors) progress += ex->progress();
            auto now = std::chrono::steady_clock::now();
            if (progress != st.last_progress) {
                st.last_progress = progress;
                st.last_change = now;
            } else if (st.failure.empty() && now - st.last_change > st.options.watchdog) {
                std::string why = "watchdog: no action completed on any rank for " +
                                  std::to_string(std::chrono::duration_cast<std::chrono::seconds>(
                                                     st.options.watchdog)
                                                     .count()) +
                                  " s;";
                for (auto* ex : st.executors) {
                    std::string at = ex->current_action();
                    why += " rank " + std::to_string(ex->rank()) + " " +
                           (at.empty() ? "finished its step" : "in " + at) + ";";
                }
                why.pop_back();
                fail(self, why);
            }
            self->delayed_send(self, std::chrono::milliseconds(200), tick_atom::value);
        },
    };
}

} // namespace

Job::Job(const Program& program, const plan::Graph& graph, const models::TokenData& data,
         CollectivesBackend backend)
    : program_(program), data_(data), comms_(std::make_unique<LocalComms>(graph, backend)) {
    for (const auto& r : graph.ranks)
        executors_.push_back(
            std::make_unique<RankExecutor>(program, graph, r.rank, comms_->for_rank(r.rank)));
}

Job::~Job() = default;

std::string Job::run(const JobOptions& options) {
    caf::actor_system_config cfg;
    cfg.add_message_type<StepOutcome>("StepOutcome");
    // The workers are detached (a thread each); the scheduler runs only the coordinator. One
    // thread that sleeps on a queue, not work-stealing threads that poll: on a small machine
    // polling threads take the cores the ranks compute on.
    cfg.set("scheduler.policy", caf::atom("sharing"));
    cfg.set("scheduler.max-threads", size_t{1});
    caf::actor_system sys{cfg};
    int cores = std::max(1, omp_get_num_procs());
    int threads = std::max(1, cores / static_cast<int>(executors_.size()));
    std::vector<worker_actor> workers;
    for (auto& ex : executors_)
        workers.push_back(sys.spawn<caf::detached>(worker, ex.get(), &data_, threads));
    CoordinatorState setup;
    setup.workers = workers;
    for (auto& ex : executors_) setup.executors.push_back(ex.get());
    setup.comms = comms_.get();
    setup.options = options;
    setup.tokens_per_step = program_.train.batch * program_.model.context;
    auto coord = sys.spawn(coordinator, std::move(setup));
    std::string result;
    {
        caf::scoped_actor self{sys};
        self->request(coord, caf::infinite, start_atom::value)
            .receive([&](std::string& r) { result = r; },
                     [&](caf::error& e) { result = "the coordinator failed: " + sys.render(e); });
        for (auto& w : workers) self->send_exit(w, caf::exit_reason::user_shutdown);
    }
    return result;
}

void Job::gather(models::Model& whole) {
    for (auto& ex : executors_)
        for (auto& [index, stage] : ex->stages())
            models::copy_to_whole(stage->params(), whole.params(), stage->tied_copies());
}

void Job::scatter(models::Model& whole) {
    for (auto& ex : executors_)
        for (auto& [index, stage] : ex->stages())
            models::copy_from_whole(whole.params(), stage->params());
}

} // namespace dist::runtime
