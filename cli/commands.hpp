// commands.hpp: the subcommands of `dist`, callable without a process (tests drive them).
//
// Each returns the exit status of the contract in DESIGN.md: 0 success, 1 user error (a
// diagnostic was printed), 2 usage error.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace dist::cli {

struct CommonOptions {
    std::string file;
    std::vector<std::string> overrides;
};

int run_check(const CommonOptions& o, std::ostream& out, std::ostream& err);
int run_fmt(const CommonOptions& o, bool write, bool check, std::ostream& out, std::ostream& err);
int run_plan(const CommonOptions& o, bool json, std::ostream& out, std::ostream& err);

struct SimOptions {
    bool json = false;
    std::string cost = "profile"; // or "unit"
    std::string svg;              // write a Gantt chart here ("" for none)
    std::string trace;            // write Chrome trace-event JSON here ("" for none)
    int32_t procs = 1;            // the processes of the run simulated (`dist run --procs N`)
};
struct CalibrateOptions {
    std::string out;    // DIR/hardware/NAME.toml
    bool quick = false; // a small grid (for tests): seconds instead of minutes
    int32_t cores = 0;  // the cores to calibrate for (0: all of this machine's)
    std::string device; // "cpu" or "cuda"; "": the GPU where the machine has one, else the CPU
};
/// Measures this machine and writes it as a hardware profile.
int run_calibrate(const CalibrateOptions& c, std::ostream& out, std::ostream& err);

struct SearchCommandOptions {
    std::string devices; // "NAME x COUNT[,NAME x COUNT...]" ("" for the script's own mesh)
    int32_t top = 10;
    bool json = false;
    bool exhaustive = false; // simulate every layout that the rules allow (checks the pruning)
};
/// The fastest layouts of the script's model on its devices, or on each device kind given.
int run_search(const CommonOptions& o, const SearchCommandOptions& s, std::ostream& out,
               std::ostream& err);

/// Simulates one training step of the script's plan.
int run_sim(const CommonOptions& o, const SimOptions& s, std::ostream& out, std::ostream& err);

struct RunOptions {
    std::string metrics;       // JSON lines, one per step ("" for none)
    std::string save;          // checkpoint folder, written at the end (and every checkpoint.every)
    std::string resume;        // continue the run saved in this folder
    std::string load;          // start from these weights (Dist or Hugging Face folder)
    bool progress = true;      // a progress line on stderr
    int64_t sample_tokens = 0; // print this many sampled tokens at the end
    std::string svg;           // the last step's timelines, measured above predicted ("" none)
    std::string trace;         // the last step as it ran, Chrome trace-event JSON ("" for none)
};
/// Trains the script's model for real on its mesh (one worker actor per rank). Within a job of
/// several processes (DIST_RANK / DIST_WORLD_SIZE, Slurm or mpirun in the environment), this
/// process's share of the ranks, with process 0 coordinating.
int run_train(const CommonOptions& o, const RunOptions& r, std::ostream& out, std::ostream& err);
/// `dist run --procs N`: runs `args` (argv[0] first, without --procs) as N processes of one job
/// on this host, forwarding their output with a "[i] " prefix; the exit status is the first
/// failing process's (0 when all succeed). After a job that succeeded, it says what other
/// processes used of the cores while it ran (beyond a tenth) and, with `pace`, how fast the
/// profile's matmul ran before the processes started and after they ended (pace.hpp).
class PaceCheck;
int launch_local(int procs, const std::vector<std::string>& args, std::ostream& out,
                 std::ostream& err, PaceCheck* pace = nullptr);
/// launch_local for the script of `o`, once it has checked and planned, its ranks are enough
/// for `procs` processes and its mesh runs here (else why, and 1, with no process started);
/// with the pace check of its profile where that is a calibrated CPU's.
int run_procs(const CommonOptions& o, int procs, const std::vector<std::string>& args,
              std::ostream& out, std::ostream& err);
/// The mean next-token loss of the weights in `load` over a data file.
/// Continues prompts (given, or read one per line from `in`) with the model in `load`, on the
/// script's mesh; the text goes to `out` as it is produced, tokens per second to `err`.
/// `tokenizer`: a folder with GPT-2's vocab.json and merges.txt ("" for bytes as tokens).
int run_generate(const CommonOptions& o, const std::string& load, const std::string& tokenizer,
                 const std::vector<std::string>& prompts, std::istream& in, std::ostream& out,
                 std::ostream& err);
int run_eval(const CommonOptions& o, const std::string& load, const std::string& data, bool json,
             std::ostream& out, std::ostream& err);

struct TokenizeOptions {
    std::string tokenizer;           // a folder with GPT-2's vocab.json and merges.txt
    std::vector<std::string> inputs; // text files, one document each
    std::string out;                 // the llm.c .bin file to write
    bool eot = false;                // each document preceded by <|endoftext|>
};
/// Text to token ids with GPT-2's byte-level BPE, written as an llm.c .bin file that
/// `train { data: ... }` reads.
int run_tokenize(const TokenizeOptions& t, std::ostream& out, std::ostream& err);

struct PlotOptions {
    std::vector<std::string> files;  // metrics files (`dist run --metrics`), one curve each
    std::vector<std::string> labels; // one per file; empty: the files' names
    std::string y = "loss";          // the value drawn against the step
    std::string title;               // "" for "<y> by step"
    std::string svg;                 // where the chart goes
};
/// One chart of a value by step for one or several runs, with a legend.
int run_plot(const PlotOptions& p, std::ostream& out, std::ostream& err);

} // namespace dist::cli
