// run_command.cpp: `dist run`: the checked program planned, then trained by the actor runtime
// on its mesh (every rank a worker actor of this process), with metrics, a progress line,
// consolidated checkpoints, a trace of the real execution and its bubble beside the simulated.
#include "cli/planned.hpp"

#include "actors/plan/graph_json.hpp"
#include "actors/plan/lower.hpp"
#include "actors/runtime/job.hpp"
#include "actors/runtime/measured.hpp"
#include "actors/sim/simulate.hpp"
#include "lang/check.hpp"
#include "lang/loader.hpp"
#include "models/atomic_file.hpp"
#include "models/checkpoint.hpp"
#include "models/trainer.hpp"
#include "transport/launch.hpp"

#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <ostream>
#include <unistd.h>

namespace fs = std::filesystem;

namespace dist::cli {

namespace {

std::string model_label(const Program& p) {
    return p.model.preset.empty() ? p.model.template_name : p.model.preset;
}

std::string mesh_label(const Program& p, const plan::Graph& g) {
    if (p.mesh.devices == 1) return "one " + p.mesh.profile.name + " device";
    return std::to_string(p.mesh.devices) + " " + p.mesh.profile.name + " ranks (dp " +
           std::to_string(g.dp) + ", tp " + std::to_string(g.tp) + ", pp " + std::to_string(g.pp) +
           ", " + to_string(g.schedule) + ")";
}

// The progress line: step, loss, tokens/s and the time left.
std::string progress_line(const models::StepMetrics& m, int64_t last, double eta) {
    char line[256];
    std::snprintf(line, sizeof line,
                  "step %5lld/%lld  loss %.4f  lr %.2e  norm %.3f  %.0f tok/s  eta %.0fs",
                  static_cast<long long>(m.step), static_cast<long long>(last), m.loss, m.lr,
                  m.grad_norm, m.tokens_per_s, eta);
    return line;
}

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
std::optional<runtime::ClusterOptions>
cluster_from_environment(const CommonOptions& o, const plan::Graph& graph, std::string& error) {
    std::optional<transport::LaunchInfo> launch =
        transport::detect_launch([](const char* n) { return std::getenv(n); }, error);
    if (!launch || launch->world_size <= 1) return std::nullopt;
    runtime::ClusterOptions c;
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
    }
    // Every process must run the same plan of the same script with the same overrides.
    std::ifstream script(o.file, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(script)), std::istreambuf_iterator<char>());
    for (const auto& s : o.overrides) bytes += "\n--set " + s;
    c.digest = digest_of(plan::to_json(graph).dump() + bytes);
    c.log = [](const std::string& line) { std::cerr << "dist: " << line << "\n" << std::flush; };
    c.abandon = [](const std::string& why) {
        std::cerr << "error: " << why << "\n(ranks of this process were still waiting on their "
                  << "peers; ending it)\n"
                  << std::flush;
        std::_Exit(1);
    };
    return c;
}

// One peer's (or a rank's summed) traffic as JSON: per kind, sent and received.
nlohmann::json kinds_json(const runtime::PeerTraffic& t) {
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

// The step's traffic with other processes, for the metrics line: per rank its totals by kind,
// and the same per peer.
nlohmann::json traffic_json(const std::vector<runtime::RankTraffic>& traffic) {
    nlohmann::json by_rank = nlohmann::json::array();
    uint64_t total = 0;
    for (size_t r = 0; r < traffic.size(); ++r) {
        runtime::PeerTraffic sum;
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

// The trace with each rank's transfers to and from other processes in the step, as an instant
// event at the end of the rank's step (its args: the same figures as the metrics' `p2p`).
std::string with_transfers(const std::string& trace, const runtime::StepReport& report) {
    const std::string end = "\n]}\n";
    if (trace.size() < end.size() || trace.compare(trace.size() - end.size(), end.size(), end) != 0)
        return trace;
    nlohmann::json ranks = traffic_json(report.traffic)["by_rank"];
    std::string events;
    for (size_t r = 0; r < report.timings.size() && r < ranks.size(); ++r) {
        double last = 0;
        for (const auto& t : report.timings[r]) last = std::max(last, t.end_s);
        nlohmann::json e = {{"name", "transfers between processes"},
                            {"ph", "i"},
                            {"s", "t"},
                            {"pid", 0},
                            {"tid", r},
                            {"ts", last * 1e6},
                            {"args", ranks[r]}};
        events += ",\n" + e.dump();
    }
    return trace.substr(0, trace.size() - end.size()) + events + end;
}

} // namespace

int run_train(const CommonOptions& o, const RunOptions& r, std::ostream& out, std::ostream& err) {
    if (!r.resume.empty() && !r.load.empty()) {
        err << "error: --resume continues a run and --load starts one from weights; give one\n";
        return 2;
    }
    std::optional<Planned> plan = planned(o, err);
    if (!plan) return 1;
    const Program& p = plan->program;
    const plan::Graph& graph = plan->graph;
    if (!runs_here(p, err, true)) return 1;
    std::string error;
    std::optional<runtime::ClusterOptions> cluster = cluster_from_environment(o, graph, error);
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 2;
    }
    // Only process 0 of a job of several writes: metrics, checkpoints, traces, the console.
    const bool lead = !cluster || cluster->process == 0;
    models::TokenData data;
    error = models::load_data(p.train.data, p.model, data);
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    const uint64_t seed = static_cast<uint64_t>(p.train.seed);
    // The whole model: what checkpoints are read into and consolidated from, made only when a
    // checkpoint or a sample needs it (it doubles the parameters' memory).
    std::optional<models::Model> whole_model;
    auto whole = [&]() -> models::Model& {
        if (!whole_model) whole_model.emplace(p.model, seed, p.schedule.recompute);
        return *whole_model;
    };
    int64_t first = 0;
    if (!r.resume.empty()) error = models::load_training_state(r.resume, whole(), first);
    if (!r.load.empty()) error = models::load_weights(r.load, whole());
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    const int64_t last = p.train.stop_after > 0 ? p.train.stop_after : p.train.steps;
    if (first >= last) {
        err << "error: `" << r.resume << "` is at step " << first << "; the script stops at step "
            << last << "\n";
        return 1;
    }
    std::ofstream metrics;
    if (!r.metrics.empty() && lead) {
        metrics.open(r.metrics, first > 0 ? std::ios::app : std::ios::trunc);
        if (!metrics) {
            err << "error: cannot write `" << r.metrics << "`: " << std::strerror(errno) << "\n";
            return 1;
        }
    }
    const std::string save_dir = !lead ? "" : !r.save.empty() ? r.save : p.train.checkpoint.dir;
    if (!save_dir.empty()) {
        // Find out now, not after hours of training, that the folder cannot be written.
        std::error_code ec;
        fs::create_directories(save_dir, ec);
        if (ec || ::access(save_dir.c_str(), W_OK) != 0) {
            err << "error: cannot save checkpoints into `" << save_dir
                << "`: " << (ec ? ec.message() : std::strerror(errno)) << "\n";
            return 1;
        }
    }

    std::optional<runtime::Job> job_storage;
    try {
        if (cluster)
            job_storage.emplace(p, graph, data, *cluster);
        else
            job_storage.emplace(p, graph, data);
    } catch (const std::exception& e) {
        err << "error: " << e.what() << "\n";
        return 1;
    }
    runtime::Job& job = *job_storage;
    if (!r.resume.empty() || !r.load.empty()) job.scatter(whole());
    if (!lead) {
        // Serve this process's ranks until the coordinator ends the job.
        runtime::JobOptions jo;
        jo.first_step = first;
        jo.end_step = last;
        error = job.run(jo);
        if (!error.empty()) {
            err << "error: " << error << "\n";
            return 1;
        }
        return 0;
    }
    bool tty = r.progress && ::isatty(STDERR_FILENO);
    double elapsed = 0.0;
    out << "training " << model_label(p) << " (" << p.model.parameters << " parameters) on "
        << (first > 0 ? "steps " + std::to_string(first + 1) + " to " : "steps 1 to ") << last
        << ", " << p.train.batch << " x " << p.model.context << " tokens each, on "
        << mesh_label(p, graph)
        << (cluster ? ", in " + std::to_string(cluster->processes) + " processes" : "") << "\n"
        << std::flush;
    std::string step_error;
    runtime::StepReport last_report;
    runtime::JobOptions jo;
    jo.first_step = first;
    jo.end_step = last;
    jo.on_step = [&](const runtime::StepReport& rep) {
        const models::StepMetrics& m = rep.metrics;
        last_report = rep;
        if (!std::isfinite(m.loss)) {
            step_error = "the loss became " + std::to_string(m.loss) + " at step " +
                         std::to_string(m.step) + "; lower train.optimizer.lr or set train.clip";
            return false;
        }
        elapsed += m.step_time_s;
        if (metrics) {
            if (cluster) {
                nlohmann::json j = nlohmann::json::parse(models::metrics_json(m));
                j["p2p"] = traffic_json(rep.traffic);
                metrics << j.dump() << "\n" << std::flush;
            } else {
                metrics << models::metrics_json(m) << "\n" << std::flush;
            }
        }
        double eta =
            elapsed / static_cast<double>(m.step - first) * static_cast<double>(last - m.step);
        std::string line = progress_line(m, last, eta);
        if (tty)
            err << "\r" << line << "\x1b[K" << std::flush;
        else if (r.progress && (m.step == first + 1 || m.step % 10 == 0 || m.step == last))
            err << line << "\n";
        bool periodic = p.train.checkpoint.every > 0 && m.step % p.train.checkpoint.every == 0;
        bool checkpoint = !save_dir.empty() && (periodic || m.step == last);
        // Across processes the others' parameters can be gathered only while the job runs.
        bool sample_later = cluster && r.sample_tokens > 0 && m.step == last;
        try {
            if (checkpoint || sample_later) job.gather(whole());
        } catch (const std::exception& e) {
            step_error = e.what();
            return false;
        }
        if (checkpoint) {
            step_error = models::save_checkpoint(save_dir, whole(), m.step, seed);
            if (!step_error.empty()) return false;
        }
        return true;
    };
    error = job.run(jo);
    if (tty) err << "\n";
    if (error.empty()) error = step_error;
    if (!error.empty()) {
        err << "error: " << error << "\n";
        return 1;
    }
    if (!save_dir.empty()) out << "saved " << save_dir << "\n";
    if (!last_report.timings.empty()) {
        sim::Timeline measured = runtime::measured_timeline(graph, last_report.timings);
        if (graph.pp > 1) {
            sim::SimResult predicted = sim::simulate(graph, p);
            char line[160];
            std::snprintf(line, sizeof line, "pipeline bubble of the last step: measured %.1f%%",
                          100.0 * measured.bubble_fraction);
            out << line;
            if (predicted.ok())
                out << ", simulated "
                    << std::to_string(100.0 * predicted.timeline->bubble_fraction).substr(0, 4)
                    << "% (`dist sim` with the " << p.mesh.profile.name << " profile)";
            out << "\n";
        }
        if (!r.trace.empty()) {
            std::string trace = sim::chrome_trace(
                measured, "dist run: " + std::string(to_string(graph.schedule)) + " (measured)");
            if (cluster) trace = with_transfers(trace, last_report);
            std::string e = models::write_file_atomically(r.trace, {trace});
            if (!e.empty()) {
                err << "error: " << e << "\n";
                return 1;
            }
            out << "trace of the last step: " << r.trace << "\n";
        }
    }
    if (r.sample_tokens > 0) {
        if (!cluster) job.gather(whole());
        GenerateSpec gen = p.generate;
        gen.max_tokens = r.sample_tokens;
        std::vector<int32_t> tokens = {'\n'};
        models::sample(whole(), gen, seed, tokens);
        std::string text(tokens.begin() + 1, tokens.end());
        for (char& c : text)
            if ((c < 32 && c != '\n' && c != '\t') || c == 127) c = '?';
        out << "sample (" << r.sample_tokens << " tokens, temperature " << gen.temperature
            << ", top-k " << gen.top_k << "):\n"
            << text << "\n";
    }
    return 0;
}

} // namespace dist::cli
