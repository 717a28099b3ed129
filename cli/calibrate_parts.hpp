// calibrate_parts.hpp: what `dist calibrate` measures on a CPU and on a GPU alike (calibrate.cpp,
// calibrate_gpu.cpp): the progress line, the UCX transfers, the whole-action probes and their
// fit, and the profile's number formats.
#pragma once

#include "actors/plan/graph.hpp"
#include "actors/runtime/steal.hpp"
#include "lang/program.hpp"

#include <sched.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace dist::cli::calibration {

using Clock = std::chrono::steady_clock;

/// Seconds since `t0`.
double since(Clock::time_point t0);
/// Seconds per call of `call`: one warm-up call, then `batches` batches of at least `min_s`
/// each, `gap` apart; the fastest (other work on a shared machine only ever slows a batch).
double per_call(const std::function<void()>& call, double min_s, int batches = 3,
                std::chrono::milliseconds gap = {});
/// `n` floats drawn uniformly from [-scale, scale] (a fixed seed).
std::vector<float> filled(int64_t n, float scale = 0.01f);
/// A TOML float with four significant digits.
std::string number(double x);
/// A TOML string's contents: quotes and backslashes escaped, control characters dropped.
std::string escaped(const std::string& s);
/// Now, as "2026-12-03T10:06:30Z".
std::string utc_now();

/// One line on stderr that says what is being measured (redrawn on a terminal, a line per
/// new step elsewhere).
class Progress {
  public:
    Progress(std::ostream& err, int total);
    void tick(const std::string& what);
    /// How many steps are done; back_to(done()) rewinds to here (a sweep taken again).
    int done() const { return done_; }
    void back_to(int done) { done_ = done; }
    void end();

  private:
    std::ostream& err_;
    int total_, done_ = 0;
    bool tty_;
    std::string last_;
};

/// Timings taken again where the host stole from them (actors/runtime/steal.hpp). A
/// calibration in a spell when the host took a fifth of the cores' time priced whole actions at
/// 1.5-3.3 times those of a quiet hour (the kernels, the fastest of three short batches, 4-10%):
/// every prediction from it was as far off. A timing during which the host took more than
/// kStolen of its CPUs' time is taken again, at most twice, and its least stolen try kept; the
/// retakes stop once they have taken `budget_s` seconds (a spell of minutes outlasts them, and
/// the profile says so).
class Retakes {
  public:
    static constexpr double kStolen = runtime::kStolenShare;
    using Reader = std::function<runtime::CpuTicks(const std::vector<int>& cpus)>;
    /// `read`: the CPUs' ticks now (a test's stand-in for /proc/stat).
    explicit Retakes(double budget_s, Reader read = runtime::read_cpu_ticks);
    /// Runs `once` (a timing on `cpus`, the process's where empty; what went wrong, or "") and
    /// again while the host took more than kStolen of those CPUs' time in every try so far;
    /// `keep` after each try less stolen than the ones before it (the first included), for
    /// the caller to keep that try's result. Stops at the first error and returns it.
    std::string take(const std::vector<int>& cpus, const std::function<std::string()>& once,
                     const std::function<void()>& keep);
    int retaken() const { return retaken_; } // timings taken again
    int stolen() const { return stolen_; }   // timings kept with more than kStolen stolen
    double worst() const { return worst_; }  // the largest share stolen from a kept timing
    /// The share of the process's CPUs' time the host took since construction.
    double share() const;

  private:
    double budget_s_, spent_s_ = 0, worst_ = 0;
    int retaken_ = 0, stolen_ = 0;
    Reader read_;
    std::vector<int> cpus_;
    runtime::CpuTicks start_;
};

/// A sweep of timings under `retakes`: `sweep` writes its rows into the vector it is given and
/// ticks `progress` as it goes; a try the host stole from runs again from the same point of the
/// progress line, and only the kept try's rows are added to `out` (those of a try before an
/// error too). What went wrong, or "".
template <class Row>
std::string sweep_under(Retakes& retakes, Progress& progress, std::vector<Row>& out,
                        const std::function<std::string(std::vector<Row>&)>& sweep) {
    const int from = progress.done();
    std::vector<Row> tried, kept;
    std::string e = retakes.take(
        {}, // the process's CPUs
        [&] {
            progress.back_to(from);
            tried.clear();
            return sweep(tried);
        },
        [&] { kept = tried; });
    out.insert(out.end(), kept.begin(), kept.end());
    return e;
}

/// The profile's comment lines on the host's steal while it was measured.
std::string steal_lines(const Retakes& r);
/// On `err`, a warning where timings were kept with over Retakes::kStolen stolen.
void warn_if_stolen(const Retakes& r, std::ostream& err);

/// The profile's comment line on the cores' time other processes used while it was measured
/// (runtime::OtherLoad).
std::string others_lines(double share);
/// On `err`, a warning where other processes used more than runtime::kOthersShare of the cores'
/// time `when` ("while this ran").
void warn_if_others(double share, const std::string& when, std::ostream& err);

/// How far the machine's pace moved while it was measured: the slowest pass of the whole-action
/// probes over the fastest, less 1, in each set of passes (pass_pace: on all the cores, on one
/// thread), the larger; 0 where no set has two passes. Other guests of the host slow these
/// cores without steal too, through the caches and the memory they share, and a pace that
/// moved by a tenth leaves every rate measured in that spell as unsure.
double pace_moved(const std::vector<double>& all, const std::vector<double>& one);
/// Beyond this, the profile is less sure than the simulator's goal of 10%, and stderr says so.
inline constexpr double kPaceMoved = 0.10;
/// The profile's comment lines on the probes' pace pass by pass.
std::string pace_lines(const std::vector<double>& all, const std::vector<double>& one);
/// The profile's `calibration.pace`, the row a run times again (cli/pace.hpp) at `flops`, its
/// rate at the probes' kept pace (pace_at_kept), with the timings it came from (FLOP/s before
/// and after each pass) in a comment; "" without a rate.
std::string pace_row_lines(const MatmulRate& row, double flops, const std::vector<double>& before,
                           const std::vector<double>& after);
/// On `err`, a warning where the pace moved more than kPaceMoved.
void warn_if_moved(const std::vector<double>& all, const std::vector<double>& one,
                   std::ostream& err);

/// The element-wise kernels a calibration times at each size (measure_elementwise,
/// gpu_elementwise): a step of the progress line each.
inline constexpr int elementwise_kernels = 14;

/// One-way seconds of messages of each size through the in-process fabric, UCX over shared
/// memory and UCX over TCP on the loopback; a transport that cannot start is named in `skipped`.
/// Each transport's messages are one sweep under `retakes`.
std::vector<TransferSample> measure_transfers(const std::vector<int64_t>& message,
                                              Progress& progress, Retakes& retakes,
                                              std::vector<std::string>& skipped);
/// Latency (the smallest message) and bandwidth (between the two largest) of `transport`.
LinkSpec link_of(const std::vector<TransferSample>& samples, const std::string& transport);

/// Whole actions against their kernels (see fit_actions).
struct ActionFit {
    int32_t threads = 0;                     // the probes' compute threads
    int width = 0;                           // the probes' width; 0: every width's
    int64_t tokens = 0;                      // the probes' tokens per microbatch (by width)
    int blocks = 0;                          // the probe's blocks (by width); 0: every count's
    std::array<double, 4> scale{1, 1, 1, 1}; // forward blocks, forward ends, backward ...
    std::array<double, 2> overhead{0, 0};    // seconds per block: forward, backward
    std::array<double, 2> first_end{0, 0};   // the first end's scales apart; 0: the ends'
    std::vector<std::string> probes; // "width 128, 64 tokens: F 1.2 ms (kernels 1.1 ms) ..."
    std::vector<std::pair<int, double>> cpu_paces{}; // cpu_paces() of the probes
};

/// Single-threaded ranks beyond the cores: a pipeline's measured median step at one count of
/// ranks a core and one width, the simulated one, and the factor on the actions' work that
/// makes them agree.
struct Oversubscribed {
    int ranks_per_core = 2, width = 0, tp = 1; // tp: the ranks' tensor-parallel groups
    double work = 1, measured = 0, simulated = 0;
    std::vector<double> passes{}, pace{}; // each pass's median step, and the probes' pace
    // The pipeline's idle time, measured (the median of its passes' median bubbles; -1: not
    // timed) and simulated at `work`.
    double bubble_measured = -1, bubble_simulated = 0;
    // The share of the cores' time the ranks' threads ran on them, measured (their CPU clocks in
    // their actions, sends and receives too; the median of its passes' median; -1: not timed)
    // and simulated at `work` (its compute actions' turns): a higher simulated share is cores
    // the run left idle, or work it did outside the actions.
    double busy_measured = -1, busy_simulated = 0;
};

/// A small GPT (vocab 256, context 64) trained 1F1B on synthetic data, for the calibration.
struct GptScript {
    int width = 128, layers = 1, heads = 4;
    std::string devices = "cpu";
    int dp = 1, pp = 1, microbatches = 2, batch = 8, steps = 8;
    int tp = 1;
    std::string schedule = "1f1b";
};
std::string gpt_script(const GptScript& s);
/// Checks and plans a calibration's script into `program` and `graph`; what was wrong, or "".
std::string plan_script(const std::string& text, Program& program, plan::Graph& graph);

/// Activations used after other microbatches' have passed through the caches: one probe
/// trained on one rank in orders that set its backwards further and further from their
/// forwards (1F1B, every one right after its forward; GPipe over more and more microbatches),
/// on each thread count, a few times over the calibration.
struct ReuseRun {
    std::string schedule;
    int microbatches = 0;
    Program program;
    plan::Graph graph;
    // For each thread count (ReuseRuns::threads) and pass, the median forward and backward a
    // microbatch (seconds; a split backward's I and W together), or {-1, -1} where it was not
    // timed.
    std::vector<std::vector<std::pair<double, double>>> passes{};
    // A split backward's: for each thread count and pass, the median I a microbatch, or -1.
    std::vector<std::vector<double>> inputs{};
};
struct ReuseRuns {
    std::vector<int32_t> threads;
    std::vector<ReuseRun> runs; // the first the reference, each backward right after its forward
    // The reference's GPT and microbatches trained zb_h1 on its one rank: each microbatch's F,
    // I and W in turn, its backward split but as near its forward as the reference's (none
    // where it cannot be planned).
    std::optional<ReuseRun> split{};
};
/// The runs (none where they cannot be planned, said in `skipped`).
ReuseRuns reuse_runs(const std::vector<int32_t>& threads, bool quick,
                     std::vector<std::string>& skipped);
/// How many trainings one pass of them makes.
int reuse_ticks(const ReuseRuns& runs);
/// One turn: each run on each thread count, a one-thread run held to a core (the next one each
/// turn), each taken again where the host stole from it (`retakes`).
void time_reuse(ReuseRuns& runs, Progress& progress, Retakes& retakes,
                std::vector<std::string>& skipped);
/// The profile's `reuse` rows from the runs: for each thread count and each run beyond the
/// reference, its backwards' distance (reuse_distances) and the median over the passes of its
/// backward's time beyond the reference's in the same pass, per byte of a microbatch's
/// activations (not below a nearer distance's); the forwards' at each distance the same times a
/// factor fitted over the runs by least squares (their forwards are at several distances), 0
/// to 2. Each backward's cost a byte at most twice the seconds a byte of copying at the largest
/// copy of `rates` on that thread count (where it has copies).
/// Rows of no cost are left out. `notes`: the model's shape, then a line for each run and
/// thread count, what was measured, and a line for each cost so bounded.
std::vector<ReuseRow> fit_reuse(const ReuseRuns& runs, const Calibration& rates,
                                std::vector<std::string>& notes);
/// A profile's text as `hardware/calibrating.toml` in a temporary folder (removed with it),
/// for pricing the calibration's own runs with what it has measured so far.
class DraftProfile {
  public:
    explicit DraftProfile(const std::string& text);
    ~DraftProfile();
    DraftProfile(const DraftProfile&) = delete;
    DraftProfile& operator=(const DraftProfile&) = delete;
    /// The folder to put on the search roots; empty where none could be made.
    const std::filesystem::path& dir() const { return dir_; }
    /// Its calibration as a script would load it; none where it does not load.
    std::optional<Calibration> calibration() const;

  private:
    std::filesystem::path dir_;
};

/// The profile's `split_backward` rows from the runs: for each thread count, the median over
/// the passes of the split run's I and W, each over the reference's backward in the same pass,
/// over the share of a whole backward that the simulator gives I (and W) with `calibration`
/// (the profile measured so far). `notes`: a line for each thread count, what was measured.
std::vector<SplitRow> fit_split(const ReuseRuns& runs, const Calibration& calibration,
                                std::vector<std::string>& notes);

/// The cores' spread: a data-parallel replica a core trained on one thread each, and in each
/// pass each step's sample variance of their compute relative to its mean.
struct SpreadRun {
    int width = 0;
    Program program;
    plan::Graph graph;
    std::vector<std::vector<double>> passes{};
};
/// The replicas' run (none where it cannot be planned, said in `skipped`).
std::optional<SpreadRun> spread_run(int32_t cores, bool quick, std::vector<std::string>& skipped);
/// One pass of it: its steps after the second, a pass of `run`'s (the run dropped where it
/// failed, said in `skipped`), taken again where the host stole from it (`retakes`).
void time_spread(std::optional<SpreadRun>& run, Progress& progress, Retakes& retakes,
                 std::vector<std::string>& skipped);
/// The sample variance of `values` over their mean (n - 1 in the denominator); 0 for fewer than
/// two or a mean not above 0.
double relative_variance(const std::vector<double>& values);
/// A core's pace's standard deviation against its mean, from the steps' relative variances of
/// `ranks` ranks at once: their median, at the median of a normal sample variance.
double spread_of(std::vector<double> variances, int32_t ranks);
/// A pass's pace (pass_pace) where the probes ran that pass, 1 (the kept pace) elsewhere.
double at_pace(const std::vector<double>& pace, int pass);
/// Whether the two passes (pass, median step) of a pipeline of ranks beyond the cores ran more
/// than kPassesApart apart, each at the probes' pace in its pass: one of them met a spell of
/// other load, and a third settles which. Run AS's calibration met one in its last pass: its
/// pipelines' steps there 9-41% longer than in the pass before at the probes' pace, their
/// factors the mean of the two, and dp 2 x tp 2 x pp 2 priced 1.16-1.22 times its step.
bool passes_apart(const std::vector<std::pair<int, double>>& passes,
                  const std::vector<double>& pace);
inline constexpr double kPassesApart = 0.10;
/// The profile's comment line on how many of the `pipelines` beyond the cores timed in two
/// passes ran them apart ("" where none was: one core, or a quick calibration's one pass).
std::string apart_lines(int apart, int pipelines);
/// On `err`, a warning where half of the pipelines or more ran their passes apart: the spell of
/// other load lasted. Calibrations that met the simulator's goals had one of eight so (runs AQ,
/// AT); those that missed them four and seven (AU; AR and AS).
void warn_if_apart(int apart, int pipelines, std::ostream& err);

/// The median over the run's passes of each one's spread (spread_of(run, ranks, pass)): the
/// cores' paces move apart and together over minutes, and a pass in a spell of other load on
/// one of them (0.05-0.07 where forty passes back to back gave 0.004-0.035 otherwise) sets
/// the level no more than a slow pass of the probes does.
double spread_of(const SpreadRun& run, int32_t ranks);
/// Pass `pass`'s spread.
double spread_of(const SpreadRun& run, int32_t ranks, size_t pass);

/// The share of a model's time in its units that its ends take (embeddings, final norm, head
/// and loss), forward and backward, and the share that its first end takes (the embeddings),
/// a part of the ends'; -1: not timed.
struct EndsShare {
    double forward = -1, backward = -1;
    double first_forward = -1, first_backward = -1;
};

struct Probe {
    int width, rows, layers;
    std::optional<Program> program;
    std::optional<plan::Graph> graph;
    double forward = 0, backward = 0; // measured seconds per microbatch
    int heads = 4;
    std::vector<double> passes{};  // each pass's forward and backward, in pass order
    std::vector<double> started{}; // when each pass's run began, seconds into run_probes
    // Each run held to one CPU (a one-thread probe beside ranks of several cores: each pass
    // runs it on each core and keeps their mean): the CPU and its forward and backward.
    std::vector<std::pair<int, double>> held{};
    // The ends' (embeddings, final norm, head, loss) share of the time in the model's units,
    // and the first end's (the embeddings) within it, timed unit by unit; -1: not timed.
    EndsShare ends{};
};

/// The ends' share of the time a probe's model spends in its units, forward and backward: the
/// model trained in this thread on `threads` threads, each unit timed by the stage's hooks,
/// the shares of the whole of several steps. The pair of a width (one block and more) tells
/// the ends only as a small difference of two large times measured apart, where a small
/// drift in between moves it by half its size; timed within the same steps, it is measured.
EndsShare ends_share(const Program& program, int rows, int32_t threads);
/// How many of a model's units come before its blocks and after them (its ends).
std::pair<size_t, size_t> end_units(const ModelSpec& spec);

/// The CPUs this process may run on, in order (empty where they cannot be read).
using runtime::allowed_cpus;

/// Holds the calling thread, and every thread it starts meanwhile (a session's executor and
/// actor threads inherit the mask of the thread that opens it), to one CPU until destroyed;
/// -1, or a CPU it may not use: as it was.
class OnCpu {
  public:
    explicit OnCpu(int cpu);
    ~OnCpu();
    OnCpu(const OnCpu&) = delete;
    OnCpu& operator=(const OnCpu&) = delete;
    bool held() const { return held_; }

  private:
    cpu_set_t saved_{};
    bool held_ = false;
};

/// The median of `v` (0 where empty): the middle value, or the mean of the two middle ones. Two
/// passes' median is their mean, not the slower of the two.
double median_of(std::vector<double> v);
/// The median of passes' (forward, backward) by their sum: the middle pass, or the mean of the
/// two middle ones.
std::pair<double, double> median_pass(std::vector<std::pair<double, double>> passes);
/// Whether run_probes' `after_pass` follows pass `pass` of `passes`: every other pass, and the
/// last; side_passes(passes) of them in all.
bool after_probe_pass(int pass, int passes);
int side_passes(int passes);
/// Trains small GPTs of the `shapes` on one rank of `devices` (a profile name: `cpu`, or a
/// GPU's) with each of `threads` compute threads (0: the runtime's choice) and times their
/// forwards and backwards, `passes` times each, each probe on every thread count in turn; the
/// probes of each thread count, in its order (each empty where a probe failed). Run first, on
/// a quiet process. `after_pass`, where given, runs after every pass with its index (other
/// work timed at the same pace: after_probe_pass says which passes the heavier follow). Where a
/// rank of one thread is probed beside one of several, each pass runs each one-thread probe on each
/// of those cores, held to it (Probe::held), and keeps the mean, so that a core is priced at
/// the cores' mean pace.
std::vector<std::vector<Probe>> run_probes(const std::vector<Probe>& shapes, int passes, bool quick,
                                           const std::string& devices,
                                           const std::vector<int32_t>& threads, Progress& progress,
                                           Retakes& retakes, std::vector<std::string>& skipped,
                                           const std::function<void(int)>& after_pass = {});
/// How fast each CPU the probes were held to ran them: for each, the geometric mean of its
/// runs' forward and backward over the kept ones, over that of all the held runs (1: the
/// cores' mean pace); empty unless they were held to two CPUs or more.
std::vector<std::pair<int, double>> cpu_paces(const std::vector<Probe>& probes);
/// How fast each pass of `probes` ran beside the times they keep: for each pass, the geometric
/// mean over the probes of that pass's forward and backward over the kept ones (1: the kept
/// pace).
std::vector<double> pass_pace(const std::vector<Probe>& probes);
/// The probes' actions against their kernels' prediction from `cal` on `threads` threads.
ActionFit fit_actions(const std::vector<Probe>& probes, const Calibration& cal, int32_t threads);
/// One probe's action beside its kernels: its blocks' and its ends' (embeddings, head, loss).
struct ActionPoint {
    double blocks = 0, ends = 0, measured = 0; // seconds
    double share = -1; // the ends' measured share of the action (ends_share); -1: unknown
};
/// The scales of a set of probe groups (each a width at a token count, its probes differing in
/// blocks) such that measured = scale of its group x blocks + one scale of the ends x ends, in
/// least squares of the ratios to the measured: {the groups' scales..., the ends' scale}. Where
/// every point's ends' share was measured, the ends' scale is their measured seconds over
/// their kernels' (summed over the points) and the groups' scales fit what is left. Where
/// the ends' scale is not determined (no group with two block counts and no shares, or not
/// positive), each group's mean ratio to its kernels for both.
std::vector<double> blocks_and_ends_scales(const std::vector<std::vector<ActionPoint>>& groups);
/// For the probes of each width at each token count (probed at least twice): the scale of their
/// blocks, and that of their ends, one for all the widths (`blocks_and_ends_scales`).
std::vector<ActionFit> fits_by_width(const std::vector<Probe>& probes, const Calibration& cal,
                                     int32_t threads);

/// The profile's rows: the probes' fit on all the cores, the fits of ranks of fewer threads and
/// what was not measured; the kernels (`where`: on what they ran); the transfers and the
/// collectives, each list after its one comment.
void write_fit(std::ostream& o, const ActionFit& fit, const std::vector<ActionFit>& fewer,
               const std::vector<ActionFit>& by_width, const std::vector<std::string>& skipped);
void write_kernels(std::ostream& o, const std::string& where, const std::vector<MatmulRate>& mm,
                   const std::vector<AttentionRate>& att, const std::vector<StreamRate>& elt);
void write_rows(std::ostream& o, const std::string& transfer_note,
                const std::vector<TransferSample>& transfers, const std::string& collective_note,
                const std::vector<CollectiveSample>& collectives);

} // namespace dist::cli::calibration

namespace dist::cli {

struct CalibrateOptions;
/// `dist calibrate` on the first GPU of `gpus` (calibrate_gpu.cpp), written to c.out as
/// profile `name`.
int run_calibrate_gpu(const CalibrateOptions& c, const std::string& name, int gpus,
                      std::ostream& out, std::ostream& err);

} // namespace dist::cli
