// main.cpp: the `dist` executable: command-line parsing (CLI11) and dispatch to the commands.
#include "cli/commands.hpp"
#include "cli/repl.hpp"

#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
    CLI::App app{"dist: check, plan and run distributed LLM training scripts"};
    app.set_version_flag("--version", "dist 0.1.0");
    app.require_subcommand(1);

    dist::cli::CommonOptions common;
    auto add_common = [&](CLI::App* sub) {
        sub->add_option("FILE", common.file, "the .dist script")->required();
        sub->add_option("--set", common.overrides,
                        "override a field of the script: KEY=VALUE (mesh.dp=2, model.layers=4)")
            ->take_all()
            ->allow_extra_args(false);
    };

    CLI::App* check = app.add_subcommand("check", "parse and check a script");
    add_common(check);

    bool write = false, check_only = false;
    CLI::App* fmt = app.add_subcommand("fmt", "print a script in the canonical layout");
    add_common(fmt);
    fmt->add_flag("--write", write, "rewrite the file in place");
    fmt->add_flag("--check", check_only, "exit 1 when the file is not formatted");

    bool json = false;
    CLI::App* plan = app.add_subcommand(
        "plan", "the actor graph: ranks, stage partition and every rank's actions");
    add_common(plan);
    plan->add_flag("--json", json, "print JSON");

    dist::cli::SimOptions sim_options;
    CLI::App* sim = app.add_subcommand("sim", "simulate one training step of the plan");
    add_common(sim);
    sim->add_flag("--json", sim_options.json, "print JSON");
    sim->add_option("--cost", sim_options.cost,
                    "profile (the mesh's hardware) or unit (F=1, B=2, I=W=1, comm 0)")
        ->check(CLI::IsMember({"unit", "profile"}));
    sim->add_option("--svg", sim_options.svg, "write a Gantt chart (SVG) to this file");
    sim->add_option("--trace", sim_options.trace,
                    "write a Chrome trace (chrome://tracing, Perfetto) to this file");
    sim->add_option("--procs", sim_options.procs,
                    "simulate the run in N processes, as `dist run --procs N` lays it out")
        ->check(CLI::Range(1, 1 << 20));

    dist::cli::SearchCommandOptions search_options;
    CLI::App* search = app.add_subcommand(
        "search", "the fastest layouts (dp, tp, pp, cp, zero, schedule, microbatches, "
                  "recomputation) of the script's model on its devices");
    add_common(search);
    search->add_option("--devices", search_options.devices,
                       "search on these devices instead: NAME x COUNT[,NAME x COUNT...]");
    search->add_option("--top", search_options.top, "rows to print (default 10)")
        ->check(CLI::Range(1, 1000));
    search->add_flag("--json", search_options.json,
                     "print JSON: each row with the --set overrides that give it");
    search->add_flag("--exhaustive", search_options.exhaustive,
                     "simulate every layout, pruning nothing (slow: to check the bounds)");

    dist::cli::CalibrateOptions calibrate_options;
    CLI::App* calibrate = app.add_subcommand(
        "calibrate", "measure this machine's kernels, transports and collectives into a "
                     "hardware profile (a few minutes)");
    calibrate
        ->add_option("--out", calibrate_options.out,
                     "the profile to write: DIR/hardware/NAME.toml (`devices: NAME` with DIR "
                     "on DIST_PATH)")
        ->required();
    calibrate->add_flag("--quick", calibrate_options.quick,
                        "a coarse grid in seconds (for tests; less accurate)");
    calibrate->add_option("--cores", calibrate_options.cores, "cores to use (default: all)")
        ->check(CLI::Range(1, 4096));
    calibrate
        ->add_option("--device", calibrate_options.device,
                     "what to calibrate: cpu, or cuda (the first GPU and NCCL between this host's "
                     "GPUs); default: cuda where the machine has a GPU, else cpu")
        ->check(CLI::IsMember({"cpu", "cuda"}));

    dist::cli::RunOptions run_options;
    bool quiet = false;
    CLI::App* run = app.add_subcommand("run", "train the script's model");
    add_common(run);
    run->add_option("--metrics", run_options.metrics,
                    "write one JSON object per step to this file");
    run->add_option("--save", run_options.save, "save a checkpoint into this folder");
    run->add_option("--resume", run_options.resume, "continue the run saved in this folder");
    run->add_option("--load", run_options.load,
                    "start from these weights (a Dist or Hugging Face model folder)");
    run->add_option("--sample", run_options.sample_tokens,
                    "after training, print this many generated tokens")
        ->check(CLI::Range(0, 1 << 20));
    run->add_flag("--quiet", quiet, "no progress line");
    run->add_option("--trace", run_options.trace,
                    "write the last step as it ran and as `dist sim` predicts it: one Chrome "
                    "trace, two processes");
    run->add_option("--svg", run_options.svg,
                    "draw the last step as it ran above its prediction (SVG)");
    int procs = 0;
    run->add_option("--procs", procs,
                    "start this many processes on this host, the ranks divided among them")
        ->check(CLI::Range(1, 1024));

    std::string generate_load, tokenizer;
    std::vector<std::string> prompts;
    CLI::App* generate = app.add_subcommand(
        "generate", "continue prompts with saved weights (--prompt, or one per line on stdin)");
    add_common(generate);
    generate->add_option("--load", generate_load, "the checkpoint folder")->required();
    generate->add_option("--prompt", prompts, "a prompt (repeatable; several are batched)");
    generate->add_option("--tokenizer", tokenizer,
                         "a folder with GPT-2's vocab.json and merges.txt (default: bytes)");

    std::string eval_load, eval_data;
    CLI::App* eval =
        app.add_subcommand("eval", "mean next-token loss of saved weights on a data file");
    add_common(eval);
    eval->add_option("--load", eval_load, "the checkpoint folder")->required();
    eval->add_option("--data", eval_data, "a text file, or llm.c tokens (.bin)")->required();
    eval->add_flag("--json", json, "print {\"loss\": ..., \"tokens\": ...}");

    dist::cli::TokenizeOptions tokenize_options;
    CLI::App* tokenize = app.add_subcommand(
        "tokenize", "text files to GPT-2 token ids in llm.c's .bin format (train { data: ... })");
    tokenize->add_option("INPUT", tokenize_options.inputs, "text files, one document each")
        ->required();
    tokenize
        ->add_option("--tokenizer", tokenize_options.tokenizer,
                     "a folder with GPT-2's vocab.json and merges.txt")
        ->required();
    tokenize->add_option("--out", tokenize_options.out, "the .bin file to write")->required();
    tokenize->add_flag("--eot", tokenize_options.eot,
                       "begin each document with <|endoftext|>, as llm.c's data scripts do");

    dist::cli::PlotOptions plot_options;
    CLI::App* plot = app.add_subcommand(
        "plot", "draw the loss (or another value) by step of one or several runs' metrics");
    plot->add_option("METRICS", plot_options.files, "files written by `dist run --metrics`")
        ->required();
    plot->add_option("--svg", plot_options.svg, "the chart to write (SVG)")->required();
    plot->add_option(
        "--y", plot_options.y,
        "the value to draw: loss (default), tokens_per_s, grad_norm, lr, aux_loss, ...");
    plot->add_option("--label", plot_options.labels,
                     "a curve's name in the legend, one per file in order (default: file names)");
    plot->add_option("--title", plot_options.title, "the chart's title");

    std::string repl_file;
    std::vector<std::string> repl_overrides;
    bool echo = false;
    CLI::App* repl = app.add_subcommand("repl", "explore plans and schedules interactively");
    repl->add_option("FILE", repl_file, "the .dist script (default: a built-in example)");
    repl->add_option("--set", repl_overrides, "start with KEY=VALUE set, as `set KEY VALUE`")
        ->take_all()
        ->allow_extra_args(false);
    repl->add_flag("--echo", echo,
                   "print each command read from a script before its answer (transcripts)");

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        int code = app.exit(e);
        return code == 0 ? 0 : 2;
    }

    if (*check) return dist::cli::run_check(common, std::cout, std::cerr);
    if (*fmt) {
        if (write && check_only) {
            std::cerr << "error: --write and --check do not go together\n";
            return 2;
        }
        return dist::cli::run_fmt(common, write, check_only, std::cout, std::cerr);
    }
    if (*plan) return dist::cli::run_plan(common, json, std::cout, std::cerr);
    if (*calibrate) return dist::cli::run_calibrate(calibrate_options, std::cout, std::cerr);
    if (*sim) return dist::cli::run_sim(common, sim_options, std::cout, std::cerr);
    if (*search) return dist::cli::run_search(common, search_options, std::cout, std::cerr);
    if (*generate)
        return dist::cli::run_generate(common, generate_load, tokenizer, prompts, std::cin,
                                       std::cout, std::cerr);
    if (*eval) return dist::cli::run_eval(common, eval_load, eval_data, json, std::cout, std::cerr);
    if (*repl) return dist::cli::run_repl(repl_file, repl_overrides, echo);
    if (*tokenize) return dist::cli::run_tokenize(tokenize_options, std::cout, std::cerr);
    if (*plot) return dist::cli::run_plot(plot_options, std::cout, std::cerr);
    if (*run) {
        if (procs > 0) {
            // The same command line without --procs, for each process.
            std::vector<std::string> args;
            for (int i = 0; i < argc; ++i) {
                std::string a = argv[i];
                if (a == "--procs") {
                    ++i;
                    continue;
                }
                if (a.rfind("--procs=", 0) == 0) continue;
                args.push_back(a);
            }
            return dist::cli::run_procs(common, procs, args, std::cout, std::cerr);
        }
        run_options.progress = !quiet;
        return dist::cli::run_train(common, run_options, std::cout, std::cerr);
    }
    return 2;
}
