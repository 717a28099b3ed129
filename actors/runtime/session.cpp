// session.cpp: the training session (see session.hpp): from the launch environment, data,
// weights and options to a Job, and each step's report through the non-finite policy, the
// metrics, the caller's callback and the checkpoint cadence.
#include "actors/runtime/session.hpp"

#include "actors/plan/graph_json.hpp"
#include "actors/runtime/auth.hpp"
#include "actors/runtime/job.hpp"
#include "actors/runtime/measured.hpp"
#include "models/checkpoint.hpp"
#include "transport/launch.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <unistd.h>

namespace fs = std::filesystem;

namespace dist::runtime {

namespace {

// FNV-1a of the bytes: the plan's digest, compared between the processes of a job.
std::string digest_of(const std::string& bytes) {
    uint64_t h = 1469598103934665603ULL;
    for (unsigned char c : bytes) h = (h ^ c) * 1099511628211ULL;
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
    return hex;
}

const char* env(const char* name) {
    const char* v = std::getenv(name);
    return v && *v ? v : nullptr;
}

// This process's place in a job of several, from the launcher's environment; nullopt for a
// job of one process. `error` says what is wrong with the environment.
std::optional<ClusterOptions> cluster_from_environment(const plan::Graph& graph,
                                                       const std::string& identity,
                                                       std::string& error) {
    std::optional<transport::LaunchInfo> launch =
        transport::detect_launch([](const char* n) { return std::getenv(n); }, error);
    if (!launch || launch->world_size <= 1) return std::nullopt;
    ClusterOptions c;
    c.process = launch->rank;
    c.processes = launch->world_size;
    c.host = launch->coordinator_host;
    c.port = static_cast<uint16_t>(launch->coordinator_port);
    c.local_process = launch->local_rank;
    // Processes on this host, to share its cores.
    for (const char* name :
         {"DIST_LOCAL_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE"})
        if (const char* v = env(name)) {
            c.local_processes = std::max(1, std::atoi(v));
            break;
        }
    if (const char* s = env("DIST_HEARTBEAT_TIMEOUT")) {
        char* end = nullptr;
        double seconds = std::strtod(s, &end);
        if (end == s || *end != '\0' || !(seconds > 0) || seconds > 86400) {
            error = std::string("DIST_HEARTBEAT_TIMEOUT: `") + s +
                    "` is not a number of seconds (0 < s <= 86400)";
            return std::nullopt;
        }
        c.heartbeat_timeout = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
    }
    if (const char* t = env("DIST_JOB_TOKEN"))
        c.token = t;
    else if (const char* f = env("DIST_JOB_TOKEN_FILE")) {
        std::ifstream in(f);
        if (!in || !std::getline(in, c.token) || c.token.empty()) {
            error = std::string("DIST_JOB_TOKEN_FILE: cannot read a token from `") + f + "`";
            return std::nullopt;
        }
    } else {
        error = "this process is one of " + std::to_string(c.processes) +
                " (the launch environment says so), and a job of several processes needs a "
                "token that every process presents: set DIST_JOB_TOKEN to the same secret in "
                "each (for example `export DIST_JOB_TOKEN=$(od -An -N32 -tx1 /dev/urandom | tr "
                "-d ' \\n')` before srun or mpirun), or DIST_JOB_TOKEN_FILE to a file that holds "
                "it; `dist run --procs N` makes one itself";
        return std::nullopt;
    }
    // Mutual TLS on the control plane: all three files, each readable, or none.
    const char* tls[3] = {env("DIST_TLS_CERT"), env("DIST_TLS_KEY"), env("DIST_TLS_CA")};
    const char* names[3] = {"DIST_TLS_CERT", "DIST_TLS_KEY", "DIST_TLS_CA"};
    if (tls[0] || tls[1] || tls[2]) {
        for (int i = 0; i < 3; ++i) {
            if (!tls[i]) {
                error = std::string("mutual TLS needs DIST_TLS_CERT, DIST_TLS_KEY and DIST_TLS_CA "
                                    "together; ") +
                        names[i] + " is not set";
                return std::nullopt;
            }
            if (!std::ifstream(tls[i])) {
                error = std::string(names[i]) + ": cannot read `" + tls[i] +
                        "`: " + std::strerror(errno);
                return std::nullopt;
            }
        }
        c.tls = {tls[0], tls[1], tls[2]};
        // A file OpenSSL cannot use would otherwise end the process inside CAF's first
        // connection.
        error = check_tls_files(c.tls.cert, c.tls.key, c.tls.ca);
        if (!error.empty()) return std::nullopt;
    }
    c.digest = digest_of(plan::to_json(graph).dump() + identity);
    return c;
}

nlohmann::json kinds_json(const PeerTraffic& t) {
    nlohmann::json j = nlohmann::json::object();
    const char* kinds[2] = {"activations", "gradients"};
    for (size_t d = 0; d < 2; ++d) {
        j[std::string("sent_") + kinds[d]] = {{"messages", t.sent[d].messages},
                                              {"bytes", t.sent[d].bytes},
                                              {"seconds", t.sent[d].seconds}};
        j[std::string("received_") + kinds[d]] = {{"messages", t.received[d].messages},
                                                  {"bytes", t.received[d].bytes},
                                                  {"wait_seconds", t.received[d].seconds}};
    }
    return j;
}

nlohmann::json traffic_object(const std::vector<RankTraffic>& traffic) {
    nlohmann::json by_rank = nlohmann::json::array();
    uint64_t total = 0;
    for (size_t r = 0; r < traffic.size(); ++r) {
        PeerTraffic sum;
        nlohmann::json peers = nlohmann::json::array();
        for (const auto& [peer, t] : traffic[r]) {
            for (size_t d = 0; d < 2; ++d) {
                sum.sent[d] += t.sent[d];
                sum.received[d] += t.received[d];
                total += t.sent[d].bytes;
            }
            nlohmann::json p = kinds_json(t);
            p["peer"] = peer;
            peers.push_back(p);
        }
        nlohmann::json j = kinds_json(sum);
        j["rank"] = r;
        j["peers"] = peers;
        by_rank.push_back(j);
    }
    return {{"bytes", total}, {"by_rank", by_rank}};
}

// batches x batch windows, without overflow.
int64_t sat_windows(int64_t batches, int64_t batch) {
    return batch > 0 && batches > INT64_MAX / batch ? INT64_MAX : batches * batch;
}

// A figure as a person reads it: "nan", "inf", or up to 6 significant digits.
std::string number(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    char text[32];
    std::snprintf(text, sizeof text, "%.6g", x);
    return text;
}

// The metrics JSON line of a step (with its traffic between processes when `processes` > 1,
// the skipped steps when there were any, and the evaluation when there was one).
std::string metrics_line(const SessionStep& s, int32_t processes) {
    nlohmann::json j = nlohmann::json::parse(models::metrics_json(s.metrics));
    if (!s.timings.empty()) j["bubble"] = s.bubble;
    if (processes > 1) j["p2p"] = traffic_object(s.traffic);
    if (s.skipped_steps > 0) {
        j["skipped_steps"] = s.skipped_steps;
        j["skipped"] = !s.nonfinite.empty();
    }
    if (s.eval_loss) {
        j["eval_loss"] = *s.eval_loss;
        j["eval_tokens"] = s.eval_tokens;
    }
    return j.dump();
}

} // namespace

std::string progress_line(const models::StepMetrics& m, int64_t last, double eta) {
    auto fixed = [](double x, int digits) {
        if (!std::isfinite(x)) return number(x);
        char text[32];
        std::snprintf(text, sizeof text, "%.*f", digits, x);
        return std::string(text);
    };
    char line[256];
    std::snprintf(
        line, sizeof line, "step %5lld/%lld  loss %s  lr %.2e  norm %s  %.0f tok/s  eta %.0fs",
        static_cast<long long>(m.step), static_cast<long long>(last), fixed(m.loss, 4).c_str(),
        m.lr, fixed(m.grad_norm, 3).c_str(), m.tokens_per_s, eta);
    return line;
}

std::string traffic_json(const std::vector<RankTraffic>& traffic) {
    return traffic_object(traffic).dump();
}

struct Session::Impl {
    const Program& program;
    const plan::Graph& graph;
    SessionOptions options;
    std::optional<ClusterOptions> cluster;
    models::TokenData data;
    models::TokenData eval_data;
    int64_t eval_windows = 0; // evaluated each time: the first ones of eval_data
    std::unique_ptr<models::Model> whole_model;
    int64_t first = 0, last = 0;
    std::string save_dir;
    std::ofstream metrics;
    std::optional<Job> job;
    std::optional<SessionStep> last_step;
    std::string saved;
    bool stopped = false, kept = false;
    int64_t skipped = 0; // steps whose update was skipped (on_nonfinite: skip)
    std::string failure; // why handle() ended the run

    Impl(const Program& p, const plan::Graph& g, SessionOptions o)
        : program(p), graph(g), options(std::move(o)) {}

    bool lead() const { return !cluster || cluster->process == 0; }
    uint64_t seed() const { return static_cast<uint64_t>(program.train.seed); }
    // The whole model: what checkpoints are read into and consolidated from, made only when a
    // checkpoint or the final weights need it (it doubles the parameters' memory).
    models::Model& whole() {
        if (!whole_model)
            whole_model =
                std::make_unique<models::Model>(program.model, seed(), program.schedule.recompute,
                                                nullptr, program.train.precision);
        return *whole_model;
    }
    bool handle(const StepReport& rep);
    std::string take_step(const StepReport& rep, bool& go_on);
};

Session::Session(const Program& program, const plan::Graph& graph, SessionOptions options)
    : impl_(std::make_unique<Impl>(program, graph, std::move(options))) {}

Session::~Session() = default;

SessionError Session::open() {
    Impl& s = *impl_;
    const SessionOptions& o = s.options;
    if (!o.resume.empty() && !o.load.empty())
        return {"--resume continues a run and --load starts one from weights; give one", true};
    if (!s.program.train.training_refusal.empty())
        return {s.program.train.training_refusal, false, true};
    std::string error;
    if (o.join_launch) {
        s.cluster = cluster_from_environment(s.graph, o.identity, error);
        if (!error.empty()) return {error, true};
        if (s.cluster) {
            s.cluster->log = o.log;
            s.cluster->abandon = o.abandon;
        }
    }
    error = models::load_data(s.program.train.data, s.program.model, s.data);
    if (!error.empty()) return {error};
    const EvalSpec& eval = s.program.train.eval;
    if (eval.every > 0 && s.lead()) {
        error = models::load_data(eval.data, s.program.model, s.eval_data);
        if (!error.empty()) return {"train.eval: " + error};
        const int64_t T = s.program.model.context;
        s.eval_windows =
            std::min(s.eval_data.eval_windows(T), sat_windows(eval.batches, s.program.train.batch));
        if (s.eval_windows == 0)
            return {"train.eval: `" + eval.data.path + "` is shorter than one window of " +
                    std::to_string(T + 1) + " tokens"};
    }
    if (!o.resume.empty()) error = models::load_training_state(o.resume, s.whole(), s.first);
    if (!o.load.empty()) error = models::load_weights(o.load, s.whole());
    if (!error.empty()) return {error};
    const TrainSpec& t = s.program.train;
    s.last = t.stop_after > 0 ? t.stop_after : t.steps;
    if (s.first >= s.last)
        return {"`" + o.resume + "` is at step " + std::to_string(s.first) +
                "; the script stops at step " + std::to_string(s.last)};
    if (!o.metrics_path.empty() && s.lead()) {
        s.metrics.open(o.metrics_path, s.first > 0 ? std::ios::app : std::ios::trunc);
        if (!s.metrics) return {"cannot write `" + o.metrics_path + "`: " + std::strerror(errno)};
    }
    s.save_dir = !s.lead() ? "" : !o.save_dir.empty() ? o.save_dir : t.checkpoint.dir;
    if (!s.save_dir.empty()) {
        // Find out now, not after hours of training, that the folder cannot be written.
        std::error_code ec;
        fs::create_directories(s.save_dir, ec);
        if (ec || ::access(s.save_dir.c_str(), W_OK) != 0)
            return {"cannot save checkpoints into `" + s.save_dir +
                    "`: " + (ec ? ec.message() : std::strerror(errno))};
    }
    try {
        if (s.cluster)
            s.job.emplace(s.program, s.graph, s.data, *s.cluster);
        else
            s.job.emplace(s.program, s.graph, s.data);
    } catch (const std::exception& e) {
        return {e.what()}; // a mesh of GPUs where there are none; a job that cannot form
    }
    if (!o.resume.empty() || !o.load.empty()) s.job->scatter(s.whole());
    return {};
}

// One step's report on process 0: whether the run goes on (else `failure` may say why).
bool Session::Impl::handle(const StepReport& rep) {
    bool go_on = true;
    failure = take_step(rep, go_on);
    return failure.empty() && go_on;
}

// The non-finite policy, the evaluation, the metrics, the caller's callback (which may clear
// `go_on`), checkpoints; "" or the failure.
std::string Session::Impl::take_step(const StepReport& rep, bool& go_on) {
    const models::StepMetrics& m = rep.metrics;
    SessionStep step;
    step.metrics = m;
    step.nonfinite = rep.nonfinite;
    step.timings = rep.timings;
    step.traffic = rep.traffic;
    if (!step.timings.empty()) step.bubble = measured_bubble(graph, step.timings);
    if (!rep.nonfinite.empty()) {
        if (program.train.on_nonfinite == NonFinitePolicy::stop)
            return "step " + std::to_string(m.step) + ": the " + rep.nonfinite +
                   " is non-finite (loss " + number(m.loss) + ", gradient norm " +
                   number(m.grad_norm) +
                   "); no weight took this step's update and the run stops (lower "
                   "train.optimizer.lr, set train.clip, or `train.on_nonfinite: skip`)";
        ++skipped;
    }
    step.skipped_steps = skipped;
    bool gathered = false;
    auto gather = [&]() -> std::string {
        if (gathered) return "";
        try {
            job->gather(whole());
        } catch (const std::exception& e) {
            return e.what();
        }
        gathered = true;
        return "";
    };
    const EvalSpec& eval = program.train.eval;
    if (eval.every > 0 && m.step % eval.every == 0) {
        // On the whole model, gathered from every rank: the loss of the weights this step left.
        if (std::string e = gather(); !e.empty()) return e;
        models::EvalResult r = models::evaluate(whole(), eval_data, eval_windows);
        step.eval_loss = r.loss;
        step.eval_tokens = r.tokens;
    }
    if (metrics.is_open())
        metrics << metrics_line(step, cluster ? cluster->processes : 1) << "\n" << std::flush;
    last_step = std::move(step);
    if (options.on_step) {
        // The caller's exceptions end the run here, inside the library, not in an actor.
        try {
            go_on = options.on_step(*last_step);
        } catch (const std::exception& e) {
            return std::string("the step callback threw: ") + e.what();
        } catch (...) {
            return "the step callback threw";
        }
    }
    if (!go_on && m.step < last) stopped = true;
    const bool periodic =
        program.train.checkpoint.every > 0 && m.step % program.train.checkpoint.every == 0;
    const bool checkpoint = !save_dir.empty() && (periodic || m.step == last || !go_on);
    // Across processes the others' parameters can be gathered only while the job runs.
    const bool keep = options.keep_weights && cluster && (m.step == last || !go_on);
    if (checkpoint || keep) {
        if (std::string e = gather(); !e.empty()) return e;
        kept = keep;
    }
    if (checkpoint) {
        std::string e = models::save_checkpoint(save_dir, whole(), m.step, seed(),
                                                program.train.checkpoint.dtype == Precision::bf16);
        if (!e.empty()) return e;
        saved = save_dir;
    }
    return "";
}

SessionError Session::run() {
    Impl& s = *impl_;
    if (!s.job) return {"the session is not open"};
    JobOptions jo;
    jo.first_step = s.first;
    jo.end_step = s.last;
    jo.threads = s.options.threads;
    if (s.lead()) jo.on_step = [&s](const StepReport& rep) { return s.handle(rep); };
    std::string error = s.job->run(jo);
    if (error.empty()) error = s.failure;
    if (!error.empty()) return {error};
    if (s.options.keep_weights && s.lead() && !s.kept) {
        // In one process the ranks are here, and nothing can be lost.
        s.job->gather(s.whole());
        s.kept = true;
    }
    return {};
}

bool Session::lead() const {
    return impl_->lead();
}
int32_t Session::processes() const {
    return impl_->cluster ? impl_->cluster->processes : 1;
}
int64_t Session::first_step() const {
    return impl_->first;
}
int64_t Session::last_step() const {
    return impl_->last;
}
const std::string& Session::saved_dir() const {
    return impl_->saved;
}
bool Session::stopped() const {
    return impl_->stopped;
}
const SessionStep* Session::last() const {
    return impl_->last_step ? &*impl_->last_step : nullptr;
}
models::Model* Session::weights() {
    return impl_->kept ? impl_->whole_model.get() : nullptr;
}
std::unique_ptr<models::Model> Session::take_weights() {
    if (!impl_->kept) return nullptr;
    impl_->kept = false;
    return std::move(impl_->whole_model);
}

} // namespace dist::runtime
